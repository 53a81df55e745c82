-- queue_state.lua: the rules that move slots between the busy slots, the grants and the
-- lines: the whole admission decision, grants and lazy expiry (admission/queue_state.py,
-- QueueState). Needs keys.lua, state.lua, windows.lua, quota.lua, busy.lua, lines.lua,
-- grants.lua and tenants.lua.
-- A ticket is a table {task, inst, prio, key (its fairness key), label, cost}.

-- The first member of zset *rkey* if its score is due (<= NOW).
local function due(rkey)
  local e = call('ZRANGE', rkey, 0, 0, 'WITHSCORES')
  if #e > 0 and tonumber(e[2]) <= NOW then return e[1] end
  return nil
end

-- The rightful next waiter its key's cap, rate windows, backoff and pause let in (none while
-- the queue is paused; scans KEY_SCAN
-- lines; QueueState.next_waiter), with its line's ring score and member.
local function next_waiter()
  if queue_paused() ~= nil then return nil end
  local n = 1
  -- Without a per-key cap, window, backoff, pause, per-cost limit or keys of their own the
  -- first line always wins.
  if S.pkc ~= nil or S.kw ~= nil or S.cmax ~= nil or (S.kb ~= nil and S.kb > NOW) or S.kx
      or (S.kpu ~= nil and S.kpu > NOW) then
    n = C_KEY_SCAN
  end
  local r = call('ZRANGE', K.ring, 0, n - 1, 'WITHSCORES')
  for i = 1, #r, 2 do
    local head = call('ZRANGE', line_rkey(sub(r[i], 21)), 0, 0)
    local w = get_waiter(sub(head[1], 12))
    if not saturated(w.key) and key_pause(w.key) == nil and not key_holds(w.key, w.cost) then
      return w, tonumber(r[i + 1]), r[i]
    end
  end
  return nil
end

-- QueueState.readmit: on an on_result queue the slot takes a fresh id (a late release of the
-- earlier delivery must not free it under the running copy); a manual slot keeps its id.
local function readmit(id, holder)
  local sl = sunpack(id, call('HGET', K.slots, id))
  if S.rel ~= 'manual' then
    drop_slot(id)
    if not sl.uncounted then count(sl.key) end
    sl.id, sl.holder = new_slot_id(), holder
    add_slot(sl)
    return sl
  end
  if sl.holder ~= holder then
    call('SREM', held_rkey(sl.holder), id)
    sl.holder = holder
    call('HSET', K.slots, id, spack(sl))
    call('SADD', held_rkey(holder), id)
  end
  return sl
end

local function grant(w)
  take(w, w.cost)
  local g = {id = new_slot_id(), granted = NOW, exp = NOW + GRANT_TTL,
             slot_exp = max_hold_until(), w = w}
  add_grant(g)
  count(w.key)
  announce(g)
end

-- Grant free slots to the rightful next waiters. A grant reserves concurrency only: the
-- rate is taken when the waiter confirms (confirm), at the instant it is really admitted.
-- A queue without a concurrency cap has nothing to reserve.
local function grant_pass(limit)
  limit = limit or C_GRANT_BATCH
  local made = 0
  if capacity() == nil then return 0 end
  while made < limit and free() > 0 do
    local w = next_waiter()
    if w == nil then break end
    grant(w)
    made = made + 1
  end
  return made
end

-- The waiter came back for its grant (the rate window allowed it): the slot becomes its own,
-- its cost charged now, to the waiter's key.
local function confirm(t)
  local g = drop_grant(t.task)
  local charge = quota_consume({task = t.task, key = g.w.key, cost = t.cost})
  count(g.w.key)
  admitted_now(g.w.key)
  local label = t.label
  if label == '' then label = g.w.label end
  local sl = {id = g.id, holder = t.inst, task = t.task, key = g.w.key, label = label,
              acquired = NOW, exp = g.slot_exp, charge = charge}
  add_slot(sl)
  return sl
end

-- Free lapsed instances' slots and slots past max_hold, pass on grants past grant_ttl,
-- prune stale waiters: at most *limit* of each kind (nil: all).
local function expire(limit)
  local lapsed = lapse(limit)
  if lapsed > 0 then grant_pass() end
  local overdue = 0
  while not limit or overdue < limit do
    local id = due(K.holds)
    if id == nil then break end
    drop_slot(id)
    overdue = overdue + 1
  end
  local late = {}
  while not limit or #late < limit do
    local task = due(K.gexp)
    if task == nil then break end
    late[#late + 1] = drop_grant(task).w
  end
  local pruned = 0
  while not limit or pruned < limit do
    local task = due(K.wexp)
    if task == nil then break end
    unline(task)
    dequeue(task)
    pruned = pruned + 1
  end
  prune_keys(limit)
  if overdue > 0 or #late > 0 then grant_pass() end
  if #late > 0 then
    -- The late waiters go back in line (their old place) only after the slots they let
    -- lapse went to the next waiters.
    for _, w in ipairs(late) do
      w.exp = NOW + WAITER_TTL
      enqueue(w)
    end
    grant_pass()
  end
  return {lapsed, overdue, #late, pruned}
end

-- How long a concurrency-blocked waiter waits before it re-checks by itself: grows with the
-- line over the capacity, but stays under half of waiter_ttl (queue_state.recheck_after).
local function recheck_at()
  local cap = capacity()
  if cap == nil or cap == 0 then cap = 1 end
  local ceiling = math.max(1, math.floor(WAITER_TTL / (2 * S.retry)))
  return NOW + S.retry * math.min(ceiling, 1 + math.floor(call('HLEN', K.waiting) / cap))
end

local function deny(t, old, retry_at, reason, block)
  if old == nil then
    local refused = refusal(t.key)
    if refused ~= nil then
      set('nref', (S.nref or 0) + 1)
      return {2, refused[1], refused[2]}
    end
  end
  local since
  retry_at, since = wait_turn(t, old, retry_at, block)
  blocked(t.task, since, t.cost, block)
  return {0, fmt(retry_at), reason}
end

local function admitted(sl) return {1, unpack(slot_reply(sl))} end

-- QueueState.admit: the whole decision for ticket t (its cost checked first).
local function admit(t)
  local busy = call('HGET', K.slots, ':' .. t.task)
  if busy then return admitted(readmit(busy, t.inst)) end
  local gs = call('HGET', K.grants, t.task)
  local g = nil
  if gs then g = gunpack(t.task, gs) end
  local pause = pause_end(g and g.w.key or t.key)
  if pause ~= nil then
    if pause == math.huge then pause = recheck_at() end
    if g ~= nil then
      -- A paused key's grant passes on to the next waiter; it waits again, in its old place.
      drop_grant(t.task)
      g.w.exp = NOW + WAITER_TTL
      enqueue(g.w)
      grant_pass()
    end
    return deny(t, get_waiter(t.task), pause, C_PAUSED)
  end
  if g then
    -- Its limits are its waiter's: the key it first asked with (what its cost may be too).
    if not check_cost(g.w.key, t.cost) then return C_COST_REFUSED end
    local block = quota_check({task = t.task, key = g.w.key, cost = t.cost})
    if block ~= nil then
      -- The slot stays reserved for it until the window lets it in.
      extend_grant(t.task, block.at + GRANT_TTL)
      blocked(t.task, g.w.since, t.cost, block)
      return {0, fmt(block.at), block.reason}
    end
    return admitted(confirm(t))
  end
  local old = get_waiter(t.task)
  local block = quota_check(t)
  if block ~= nil then return deny(t, old, block.at, block.reason, block) end
  -- Serve the waiters better than this ticket first, one free slot each.
  local nfree = free()
  local capped = capacity() ~= nil
  local competes = not saturated(t.key)
  local head, hs, hm = next_waiter()
  local made = 0
  while nfree > 0 and capped and head ~= nil and head.task ~= t.task do
    if made >= C_GRANT_BATCH or (competes and old == nil and beats(t, hs, hm)) then break end
    grant(head)
    nfree = nfree - 1
    made = made + 1
    head, hs, hm = next_waiter()
  end
  if nfree <= 0 then return deny(t, old, recheck_at(), C_CONCURRENCY) end
  if not competes then return deny(t, old, recheck_at(), C_PER_KEY) end
  if old ~= nil and capped and head ~= nil and head.task ~= t.task then
    return deny(t, old, recheck_at(), C_CONCURRENCY)
  end
  local charge = quota_consume(t)
  if old ~= nil then take(old, t.cost) else admit_new(t.key, t.cost) end
  count(t.key)
  admitted_now(t.key)
  local sl = {id = new_slot_id(), holder = t.inst, task = t.task, key = t.key, label = t.label,
              acquired = NOW, exp = max_hold_until(), charge = charge}
  add_slot(sl)
  return admitted(sl)
end
