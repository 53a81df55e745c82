-- lines.lua: the waiter lines of one queue, who waits and in which order they are served
-- (admission/lines.py, Lines). Needs keys.lua, state.lua, slot_records.lua and key_rules.lua.
--
-- A waiter is a table {task, prio, key (its fairness key), label, seq, inst, since, exp, cost}.
-- Sorted lines use the score for -priority (-1e6..1e6) and fixed-width fields in the member
-- for the rest, so ties sort by member bytes:
--   ORD = %011x of (+seq for fifo, -seq for lifo) + 2^40   (seq < 2^40)
--   R   = '0' for a key below its reserve, else '1'
--   RK  = the line's rank (its tag, weighted fair queueing's virtual start time, plus
--         0.5 / weight: Lines._rank), a double >= 0, as 8 big-endian bytes
--         (struct.pack '>d'), whose byte order is the numbers' order
-- A ring member is R .. RK .. ORD .. group key. The tags: vtime holds each line's, and each
-- idle key's while it is ahead of S.vclock (the virtual time, the last rank served), vidle those idle ones by tag.
local OFF = 1099511627776  -- 2^40

local function ord(seq) return string.format('%011x', seq + OFF) end
local function unord(s) return tonumber(sub(s, 1, 11), 16) - OFF end
local function line_rkey(gk) return BASE .. 'line:' .. gk end

-- Bytewise string order (Lua's < follows the server's LC_COLLATE).
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local function wunpack(task, s)
  local a = cmsgpack.unpack(s)
  return {task = task, prio = a[1], key = a[2], label = a[3], seq = a[4], inst = a[5],
          since = a[6], exp = a[7], cost = a[8] or 1}
end

local function wpack(w)
  return cmsgpack.pack({w.prio, w.key, w.label, w.seq, w.inst, w.since, w.exp, w.cost or 1})
end

local function get_waiter(task)
  local s = call('HGET', K.waiting, task)
  if s then return wunpack(task, s) end
  return nil
end

-- One line per fairness key (fairness="key", or keys may differ: a per-key cap, reserve or
-- bound, keys= or set_key: S.kx), else one shared line (""); key_rules.lua's grouped.
local function grouped() return S.fair == 'key' or S.pkc ~= nil or S.kx == true end
local function group(key) if grouped() then return key end return '' end
local function order2(seq) if S.order == 'lifo' then return -seq end return seq end

-- A ring member's reserve flag, rank, order and group key.
local function parse_ring(member)
  return sub(member, 1, 1), struct.unpack('>d', sub(member, 2, 9)),
         tonumber(sub(member, 10, 20), 16) - OFF, sub(member, 21)
end

-- Lines._reserve_flag: '0' for a key holding fewer slots (plus *extra*) than its reserve.
local function reserve_flag(gk, extra)
  if not grouped() then return '1' end
  local reserve = key_rules(gk).reserve
  if reserve > 0 and held(gk) + (extra or 0) < reserve then return '0' end
  return '1'
end

local function tag_of(gk) return tonumber(call('HGET', K.vtime, gk)) end

-- Lines._rank: a line's place among lines of one priority and reserve flag, the midpoint of
-- its next unit of service (0 where keys are not weighed).
local function rank_of(gk, vt)
  if S.fair == 'key' then return vt + 0.5 / key_rules(gk).weight end
  return 0
end

-- Lines._start: the tag of a key that starts waiting (no credit for time away).
local function start_tag(gk)
  local vt = tag_of(gk)
  if vt == nil or vt < S.vclock then return S.vclock end
  return vt
end

-- Lines._rest: line gk is empty; its tag is kept while it is ahead of the virtual time.
local function rest_line(gk)
  local vt = tag_of(gk)
  if vt == nil then return end
  if vt > S.vclock then call('ZADD', K.vidle, fmt(vt), gk) else call('HDEL', K.vtime, gk) end
end

-- Lines._refresh: the ring entry of line gk, from its head (none for an empty line).
local function refresh_line(gk)
  local old = call('HGET', K.ringent, gk)
  if old then call('ZREM', K.ring, old) end
  local head = call('ZRANGE', line_rkey(gk), 0, 0, 'WITHSCORES')
  if #head == 0 then
    if old then call('HDEL', K.ringent, gk) end
    rest_line(gk)
    return
  end
  local vt = 0
  if S.fair == 'key' then
    if not old then  -- a line that starts
      vt = start_tag(gk)
      call('ZREM', K.vidle, gk)
      call('HSET', K.vtime, gk, fmt(vt))
    else
      vt = tag_of(gk)
    end
  end
  local member = reserve_flag(gk) .. struct.pack('>d', rank_of(gk, vt)) .. sub(head[1], 1, 11) .. gk
  call('ZADD', K.ring, head[2], member)
  call('HSET', K.ringent, gk, member)
end

-- Lines.recount: key's held slots changed; its line moves if that crosses its reserve.
local function recount(key)
  local gk = group(key)
  local old = call('HGET', K.ringent, gk)
  if old and sub(old, 1, 1) ~= reserve_flag(gk) then refresh_line(gk) end
end

-- Only a key with a reserve can cross it; reserves exist only where S.kx is set.
ON_COUNT.f = function(key) if S.kx then recount(key) end end

local function line_add(w)
  local gk = group(w.key)
  call('ZADD', line_rkey(gk), 0 - w.prio, ord(order2(w.seq)) .. w.task)
  return gk
end

-- Lines._rebuild: every line again, after the grouping or the order changed.
local function rebuild_lines()
  for _, gk in ipairs(call('HKEYS', K.ringent)) do call('DEL', line_rkey(gk)) end
  call('DEL', K.ring, K.ringent, K.vtime, K.vidle)
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
  call('ZREM', line_rkey(gk), ord(order2(w.seq)) .. w.task)
  refresh_line(gk)
  return w
end

local function dequeue(task)
  local w = get_waiter(task)
  if w == nil then return nil end
  return dequeue_w(w)
end

-- Lines._advance: key gk was served at *tag*, *cost*: the virtual time moves to the rank
-- served, the key's tag on by cost / its weight; idle tags the virtual time passed are dropped.
local function advance(gk, tag, cost)
  if S.fair ~= 'key' then return end
  local rank = rank_of(gk, tag)
  if rank > S.vclock then set('vclock', rank) end
  local finish = tag + cost / key_rules(gk).weight
  if call('EXISTS', line_rkey(gk)) == 1 then
    call('HSET', K.vtime, gk, fmt(finish))
    refresh_line(gk)
  else
    call('ZREM', K.vidle, gk)
    call('HSET', K.vtime, gk, fmt(finish))
    rest_line(gk)
  end
  local gone = call('ZRANGEBYSCORE', K.vidle, '-inf', fmt(S.vclock), 'LIMIT', 0, 1000)
  while #gone > 0 do
    call('HDEL', K.vtime, unpack(gone))
    call('ZREM', K.vidle, unpack(gone))
    gone = call('ZRANGEBYSCORE', K.vidle, '-inf', fmt(S.vclock), 'LIMIT', 0, 1000)
  end
end

-- Lines.take: serve waiter w at *cost* (a grant, or its own admission).
local function take(w, cost)
  local gk = group(w.key)
  local tag = 0
  if S.fair == 'key' then tag = tag_of(gk) or S.vclock end
  dequeue_w(w)
  advance(gk, tag, cost)
end

-- Lines.admit_new: a ticket that was not waiting is admitted; while others wait its key's
-- tag moves on as if it had waited.
local function admit_new(key, cost)
  if S.nw > 0 and S.fair == 'key' then
    local gk = group(key)
    local tag
    if call('EXISTS', line_rkey(gk)) == 1 then tag = tag_of(gk) else tag = start_tag(gk) end
    advance(gk, tag, cost)
  end
end

-- Lines.waiting_of: how many waiters key has.
local function waiting_of(key) return call('ZCARD', line_rkey(group(key))) end

-- Would ticket t, not waiting yet, be served before the head whose ring entry is (hs, hm)?
local function beats(t, hs, hm)
  local gk = group(t.key)
  local mp, mo = 0 - t.prio, order2(S.seq + 1)
  local lh = call('ZRANGE', line_rkey(gk), 0, 0, 'WITHSCORES')
  if #lh > 0 then
    local lp, lo = tonumber(lh[2]), unord(lh[1])
    if lp < mp or (lp == mp and lo < mo) then return false end
  end
  local rank = 0
  if S.fair == 'key' then
    if #lh > 0 then rank = rank_of(gk, tag_of(gk)) else rank = rank_of(gk, start_tag(gk)) end
  end
  local mf = reserve_flag(gk)
  local hf, hrank, ho, hgk = parse_ring(hm)
  if mp ~= hs then return mp < hs end
  if mf ~= hf then return mf < hf end
  if rank ~= hrank then return rank < hrank end
  if mo ~= ho then return mo < ho end
  return bytes_less(gk, hgk)
end

-- Lines.wait_turn: ticket t (waiter *old*, or nil for a newcomer) waits, denied until
-- *retry_at* (for *block*, if a rate limit's); when it may come back, and since when it waits.
-- A waiter that re-checks keeps its place: same priority, key, seq and line entry. A rate
-- block's waiter comes back at its turn (block:turn, quota.lua), counting the waiters ahead
-- of it in its line (a key window's only where the line is the key's).
local function wait_turn(t, old, retry_at, block)
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
    local line = line_rkey(group(w.key))
    local ahead = call('ZRANK', line, ord(order2(w.seq)) .. w.task)
    local mean = 1
    if block.per_cost and ahead > 0 then  -- the cost of those ahead, from a few spread over them
      local n, sum = math.min(ahead, C_TURN_SAMPLE), 0
      for j = 0, n - 1 do
        local at = math.floor((2 * j + 1) * ahead / (2 * n))
        sum = sum + get_waiter(sub(call('ZRANGE', line, at, at)[1], 12)).cost
      end
      mean = sum / n
    end
    retry_at = block:turn(ahead, mean)
    fresh = fresh and ahead == 0
  end
  if not fresh then
    w.exp = retry_at + WAITER_TTL
    call('HSET', K.waiting, t.task, wpack(w))
    call('ZADD', K.wexp, fmt(w.exp), t.task)
    due_by(w.exp)
  end
  return retry_at, since
end
