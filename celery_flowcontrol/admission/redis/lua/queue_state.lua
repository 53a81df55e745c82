-- queue_state.lua: the full rules of one flow queue (QueueState), after prelude.lua.
--
-- Lines, grants, expiry, the whole admission decision and the operator reads. Key layout,
-- KEYS, ARGV, encodings and how scripts are assembled: keys.lua.

-- Flat reply forms (Redis truncates Lua numbers to integers: times go as strings).
local function slot_reply(sl)
  return {sl.id, sl.holder, sl.task, sl.key, sl.label, fmt(sl.acquired),
          sl.exp and fmt(sl.exp) or ''}
end

local function admitted(sl) return {1, unpack(slot_reply(sl))} end

local function free()
  local cap = capacity()
  if cap == nil then return math.huge end
  return cap - call('HLEN', K.slots) / 2 - call('HLEN', K.grants)
end

-- The first member of zset *key* if its score is due (<= NOW).
local function due(key)
  local e = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #e > 0 and tonumber(e[2]) <= NOW then return e[1] end
  return nil
end

local function ord(seq) return string.format('%011x', seq + OFF) end
local function unord(s) return tonumber(sub(s, 1, 11), 16) - OFF end
local function line_key(gk) return BASE .. 'line:' .. gk end

-- Bytewise string order (Lua's < follows the server's LC_COLLATE).
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end





-- -- records ------------------------------------------------------------------------------
local function wunpack(task, s)
  local a = cmsgpack.unpack(s)
  return {task = task, prio = a[1], key = a[2], label = a[3], seq = a[4], inst = a[5],
          since = a[6], exp = a[7], cost = a[8] or 1}
end

local function wpack(w)
  return cmsgpack.pack({w.prio, w.key, w.label, w.seq, w.inst, w.since, w.exp, w.cost or 1})
end



local function gunpack(task, s)
  local a = cmsgpack.unpack(s)
  return {id = a[1], granted = a[2], exp = a[3], slot_exp = a[4] or nil,
          w = {task = task, prio = a[5], key = a[6], label = a[7], seq = a[8], inst = a[9],
               since = a[10], exp = a[11], cost = a[12] or 1}}
end

local function gpack(g)
  local w = g.w
  return cmsgpack.pack({g.id, g.granted, g.exp, g.slot_exp or false, w.prio, w.key, w.label, w.seq,
                        w.inst, w.since, w.exp, w.cost or 1})
end

local function get_waiter(task)
  local s = call('HGET', K.waiting, task)
  if s then return wunpack(task, s) end
  return nil
end


local function waiter_reply(w)
  return {w.task, w.prio, w.key, w.label, w.seq, w.inst, fmt(w.since), fmt(w.exp),
          fmt(w.cost or 1)}
end

-- -- config -------------------------------------------------------------------------------
local function grouped() return S.fair == 'key' or S.pkc ~= nil end
local function group(key) if grouped() then return key end return '' end
local function order2(seq) if S.order == 'lifo' then return -seq end return seq end




-- -- waiter lines -------------------------------------------------------------------------
local function parse_ring(member)
  return tonumber(sub(member, 1, 14), 16), tonumber(sub(member, 15, 25), 16) - OFF,
         sub(member, 26)
end

local function refresh_line(gk)
  local old = call('HGET', K.ringent, gk)
  if old then call('ZREM', K.ring, old) end
  local head = call('ZRANGE', line_key(gk), 0, 0, 'WITHSCORES')
  if #head == 0 then
    if old then call('HDEL', K.ringent, gk) end
    call('HDEL', K.vtime, gk)
    return
  end
  local vt = 0
  if S.fair == 'key' then
    vt = tonumber(call('HGET', K.vtime, gk))
    if vt == nil then
      vt = S.vclock
      call('HSET', K.vtime, gk, fmt(vt))
    end
  end
  local member = string.format('%014x', vt) .. sub(head[1], 1, 11) .. gk
  call('ZADD', K.ring, head[2], member)
  call('HSET', K.ringent, gk, member)
end

local function line_add(w)
  local gk = group(w.key)
  call('ZADD', line_key(gk), 0 - w.prio, ord(order2(w.seq)) .. w.task)
  return gk
end

local function rebuild_lines()
  for _, gk in ipairs(call('HKEYS', K.ringent)) do call('DEL', line_key(gk)) end
  call('DEL', K.ring, K.ringent)
  local all = call('HGETALL', K.waiting)
  local seen, gks = {}, {}
  for i = 1, #all, 2 do
    local gk = line_add(wunpack(all[i], all[i + 1]))
    if not seen[gk] then
      seen[gk] = true
      gks[#gks + 1] = gk
    end
  end
  for _, gk in ipairs(gks) do refresh_line(gk) end
end

local function enqueue(w)
  call('HSET', K.waiting, w.task, wpack(w))
  set('nw', S.nw + 1)
  call('ZADD', K.wexp, fmt(w.exp), w.task)
  due_by(w.exp)
  refresh_line(line_add(w))
end

local function dequeue_w(w)
  call('HDEL', K.waiting, w.task)
  set('nw', S.nw - 1)
  call('ZREM', K.wexp, w.task)
  local gk = group(w.key)
  call('ZREM', line_key(gk), ord(order2(w.seq)) .. w.task)
  refresh_line(gk)
  return w
end

local function dequeue(task)
  local w = get_waiter(task)
  if w == nil then return nil end
  return dequeue_w(w)
end

local function served(key)
  if S.fair == 'key' then
    set('vclock', S.vclock + 1)
    local gk = group(key)
    if call('EXISTS', line_key(gk)) == 1 then
      call('HSET', K.vtime, gk, fmt(S.vclock))
      refresh_line(gk)
    end
  end
end


-- The rightful next waiter its key's cap, rate windows and backoff let in (scans KEY_SCAN
-- lines; QueueState.next_waiter), with its line's ring score and member.
local function next_waiter()
  local n = 1
  -- Without a per-key cap, window, backoff or per-cost limit the first line always wins.
  if S.pkc ~= nil or S.kw ~= nil or S.cmax ~= nil or (S.kb ~= nil and S.kb > NOW) then
    n = KEY_SCAN
  end
  local r = call('ZRANGE', K.ring, 0, n - 1, 'WITHSCORES')
  for i = 1, #r, 2 do
    local head = call('ZRANGE', line_key(sub(r[i], 26)), 0, 0)
    local w = get_waiter(sub(head[1], 12))
    if not saturated(w.key) and not key_holds(w.key, w.cost) then
      return w, tonumber(r[i + 1]), r[i]
    end
  end
  return nil
end

-- Would ticket t, not waiting yet, be served before the head whose ring entry is (hs, hm)?
local function beats(t, hs, hm)
  local gk = group(t.key)
  local mp, mo = 0 - t.prio, order2(S.seq + 1)
  local lh = call('ZRANGE', line_key(gk), 0, 0, 'WITHSCORES')
  if #lh > 0 then
    local lp, lo = tonumber(lh[2]), unord(lh[1])
    if lp < mp or (lp == mp and lo < mo) then return false end
  end
  local vt = 0
  if S.fair == 'key' then vt = tonumber(call('HGET', K.vtime, gk)) or S.vclock end
  local hvt, ho, hgk = parse_ring(hm)
  if mp ~= hs then return mp < hs end
  if vt ~= hvt then return vt < hvt end
  if mo ~= ho then return mo < ho end
  return bytes_less(gk, hgk)
end

-- -- slots --------------------------------------------------------------------------------






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
    call('SREM', held_key(sl.holder), id)
    sl.holder = holder
    call('HSET', K.slots, id, spack(sl))
    call('SADD', held_key(holder), id)
  end
  return sl
end


-- -- grants -------------------------------------------------------------------------------
-- The announcements this call made, in order: release.lua returns them too, so the releasing
-- process hands a grant to its own waiter without waiting for its pub/sub copy.
local ANNOUNCED = {}

local function grant(w)
  dequeue_w(w)
  served(w.key)
  local g = {id = new_slot_id(), granted = NOW, exp = NOW + GRANT_TTL, slot_exp = max_hold_until(), w = w}
  call('HSET', K.grants, w.task, gpack(g))
  set('ng', S.ng + 1)
  call('ZADD', K.gexp, fmt(g.exp), w.task)
  due_by(g.exp)
  count(w.key)
  -- w.inst: the waiter's instance (the worker that parked it) wakes it; see base.Grant.
  local payload = cjson.encode({S.name, w.task, g.id, fmt(g.granted), fmt(g.exp), w.inst})
  call('PUBLISH', CHANNEL, payload)
  ANNOUNCED[#ANNOUNCED + 1] = payload
end

local function drop_grant(task)
  local g = gunpack(task, call('HGET', K.grants, task))
  call('HDEL', K.grants, task)
  set('ng', S.ng - 1)
  call('ZREM', K.gexp, task)
  uncount(g.w.key)
  return g
end

-- Grant free slots to the rightful next waiters. A grant reserves concurrency only: the
-- rate is taken when the waiter confirms (confirm), at the instant it is really admitted.
-- A queue without a concurrency cap has nothing to reserve.
local function grant_pass(limit)
  limit = limit or GRANT_BATCH
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
  local label = t.label
  if label == '' then label = g.w.label end
  local sl = {id = g.id, holder = t.inst, task = t.task, key = g.w.key, label = label,
              acquired = NOW, exp = g.slot_exp, charge = charge}
  add_slot(sl)
  return sl
end

-- Keep a grant until at least *at* (its waiter came back while the window was spent).
local function extend_grant(task, at)
  local g = gunpack(task, call('HGET', K.grants, task))
  if at > g.exp then
    g.exp = at
    call('HSET', K.grants, task, gpack(g))
    call('ZADD', K.gexp, fmt(at), task)
  end
end

-- -- expiry -------------------------------------------------------------------------------

local function lapse(limit)
  local freed = 0
  -- A manual queue's slots outlive their holder (work outside the worker): only release or
  -- max_hold frees them. The lease still goes.
  local manual = S.rel == 'manual'
  while true do
    local instance = due(K.leases)
    if instance == nil then break end
    call('ZREM', K.leases, instance)
    if not manual then
      for _, id in ipairs(call('SMEMBERS', held_key(instance))) do
        drop_slot(id)
        freed = freed + 1
      end
    end
    if limit and freed >= limit then break end
  end
  if freed > 0 then grant_pass() end
  return freed
end

-- Free lapsed instances' slots and slots past max_hold, pass on grants past grant_ttl,
-- prune stale waiters: at most *limit* of each kind (nil: all).
local function expire(limit)
  local lapsed = lapse(limit)
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

-- -- decisions ----------------------------------------------------------------------------
-- How long a concurrency-blocked waiter waits before it re-checks by itself: grows with the
-- line over the capacity, but stays under half of waiter_ttl (QueueState._backoff).
local function backoff()
  local cap = capacity()
  if cap == nil or cap == 0 then cap = 1 end
  local ceiling = math.max(1, math.floor(WAITER_TTL / (2 * S.retry)))
  return S.retry * math.min(ceiling, 1 + math.floor(call('HLEN', K.waiting) / cap))
end

-- A waiter that re-checks keeps its place: same priority, key, seq and line entry. A rate
-- block's waiter comes back at its turn, one pace per waiter ahead of it in its line (a key
-- window's only where the line is the key's): Lines.wait_turn.
local function deny(t, old, retry_at, reason, block)
  local since, w, fresh = NOW, old, old == nil
  if fresh then
    set('seq', S.seq + 1)
    w = {task = t.task, prio = t.prio, key = t.key, label = t.label, seq = S.seq,
         inst = t.inst, since = NOW, exp = retry_at + WAITER_TTL, cost = t.cost}
    enqueue(w)
  else
    w.label, w.inst, since = t.label, t.inst, old.since
  end
  if block ~= nil and block.pace ~= nil and block.pace > 0 and (not block.keyed or grouped()) then
    local line = line_key(group(w.key))
    local ahead = call('ZRANK', line, ord(order2(w.seq)) .. w.task)
    local mean = 1
    if block.per_cost and ahead > 0 then  -- the cost of those ahead, from a few spread over them
      local n, sum = math.min(ahead, TURN_SAMPLE), 0
      for j = 0, n - 1 do
        local at = math.floor((2 * j + 1) * ahead / (2 * n))
        sum = sum + get_waiter(sub(call('ZRANGE', line, at, at)[1], 12)).cost
      end
      mean = sum / n
    end
    retry_at = retry_at + TURN_EARLY * ahead * block.pace * mean
    fresh = fresh and ahead == 0
  end
  if not fresh then
    w.exp = retry_at + WAITER_TTL
    call('HSET', K.waiting, t.task, wpack(w))
    call('ZADD', K.wexp, fmt(w.exp), t.task)
    due_by(w.exp)
  end
  blocked(t.task, since, t.cost, block)
  return {0, fmt(retry_at), reason}
end


local function admit(t)
  local busy = call('HGET', K.slots, ':' .. t.task)
  if busy then return admitted(readmit(busy, t.inst)) end
  local gs = call('HGET', K.grants, t.task)
  if gs then
    -- Its limits are its waiter's: the key it first asked with.
    local g = gunpack(t.task, gs)
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
    if made >= GRANT_BATCH or (competes and old == nil and beats(t, hs, hm)) then break end
    grant(head)
    nfree = nfree - 1
    made = made + 1
    head, hs, hm = next_waiter()
  end
  if nfree <= 0 then return deny(t, old, NOW + backoff(), 'concurrency') end
  if not competes then return deny(t, old, NOW + backoff(), 'per_key') end
  if old ~= nil and capped and head ~= nil and head.task ~= t.task then
    return deny(t, old, NOW + backoff(), 'concurrency')
  end
  local charge = quota_consume(t)
  if old ~= nil then dequeue_w(old) end
  served(t.key)
  count(t.key)
  local sl = {id = new_slot_id(), holder = t.inst, task = t.task, key = t.key, label = t.label,
              acquired = NOW, exp = max_hold_until(), charge = charge}
  add_slot(sl)
  return admitted(sl)
end

-- Room came back in the rate limits (QueueState._offer): the oldest pending grant is
-- announced again (a 7th field, the announcement's number, keeps the copy distinct), or a
-- queue without a concurrency cap grants its next waiter.
local function offer()
  local first = call('ZRANGE', K.gexp, 0, 0)
  if #first > 0 then
    local g = gunpack(first[1], call('HGET', K.grants, first[1]))
    set('ann', (S.ann or 0) + 1)
    local payload = cjson.encode({S.name, first[1], g.id, fmt(g.granted), fmt(g.exp), g.w.inst,
                                  S.ann})
    call('PUBLISH', CHANNEL, payload)
    ANNOUNCED[#ANNOUNCED + 1] = payload
  elseif capacity() == nil then
    local w = next_waiter()
    if w ~= nil then grant(w) end
  end
end

-- -- operator reads -----------------------------------------------------------------------
-- Waiters in serving order: replays the ring as grants would walk it (a heap of the lines
-- that moved on, merged with the ring read in order).
local function entry_less(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  if a[3] ~= b[3] then return a[3] < b[3] end
  return bytes_less(a[4], b[4])
end

local function heap_push(h, e)
  h[#h + 1] = e
  local i = #h
  while i > 1 do
    local p = math.floor(i / 2)
    if not entry_less(h[i], h[p]) then break end
    h[i], h[p] = h[p], h[i]
    i = p
  end
end

local function heap_pop(h)
  local top = h[1]
  h[1] = h[#h]
  h[#h] = nil
  local i, n = 1, #h
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and entry_less(h[l], h[m]) then m = l end
    if r <= n and entry_less(h[r], h[m]) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top
end

local function ordered_waiters(limit)
  local out, heap, pos = {}, {}, {}
  local vclock = S.vclock
  local ring, rpos, rnext = {}, 1, 0  -- buffered ring entries; the next ring rank to read
  local batch = math.min(math.max(limit, 1), 256)
  while #out < limit do
    if rpos > #ring and rnext >= 0 then
      local r = call('ZRANGE', K.ring, rnext, rnext + batch - 1, 'WITHSCORES')
      ring, rpos = {}, 1
      for i = 1, #r, 2 do
        local vt, o2, gk = parse_ring(r[i])
        ring[#ring + 1] = {tonumber(r[i + 1]), vt, o2, gk}
      end
      if #r < 2 * batch then rnext = -1 else rnext = rnext + batch end
    end
    local re, he = ring[rpos], heap[1]
    local e
    if he ~= nil and (re == nil or entry_less(he, re)) then
      e = heap_pop(heap)
    elseif re ~= nil then
      e = re
      rpos = rpos + 1
    else
      break
    end
    local gk = e[4]
    local i = pos[gk] or 0
    local m = call('ZRANGE', line_key(gk), i, i + 1, 'WITHSCORES')
    out[#out + 1] = waiter_reply(get_waiter(sub(m[1], 12)))
    pos[gk] = i + 1
    if #m > 2 then
      local vt = 0
      if S.fair == 'key' then
        vclock = vclock + 1
        vt = vclock
      end
      heap_push(heap, {tonumber(m[4]), vt, unord(m[3]), gk})
    end
  end
  return out
end
