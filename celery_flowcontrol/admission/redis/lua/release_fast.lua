-- release_fast.lua: release.lua's start, and its fast path. Sent first (scripts.py), before
-- any module: each "local function" a script passes costs every call a closure, and most
-- releases end here. Arguments and replies: release.lua.
-- Frees the slot (slot_records.lua's drop_slot, written out) and counts it in the queue's
-- release rate; with no waiter in any line there is no grant to make, and nothing else to read.
do
  local rcall, id = redis.call, ARGV[6]
  local base = string.sub(KEYS[1], 1, -4)
  local slots = base .. 'slots'
  local s = rcall('HGET', slots, id)
  if not s then return 0 end  -- also when the queue does not exist
  local sl = cmsgpack.unpack(s)  -- {holder, task, key, label, acquired, expires|false, uncounted}
  rcall('HDEL', slots, id, ':' .. sl[2])
  if sl[6] then rcall('ZREM', base .. 'holds', id) end
  if not sl[7] then
    local keycount = base .. 'keycount'
    if rcall('HINCRBY', keycount, sl[3], -1) <= 0 then rcall('HDEL', keycount, sl[3]) end
  end
  rcall('SREM', base .. 'held:' .. sl[1], id)
  -- The release rate (release_rate.py's ReleaseRate): "<rate> <at ms>" in the string key
  -- rr, decayed to now, plus one release. The clock is keys.lua's, read here early.
  local ms = ARGV[5]
  if ms == '' then
    local t = rcall('TIME')
    ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  else
    ms = tonumber(ms)
  end
  local rr, rate = rcall('GET', base .. 'rr'), 0
  if rr then
    local sp = string.find(rr, ' ', 1, true)
    local since = math.max(0, ms - tonumber(string.sub(rr, sp + 1)))
    rate = tonumber(string.sub(rr, 1, sp - 1)) * math.exp(-since / (1000 * C.RELEASE_TAU))
  end
  rcall('SET', base .. 'rr', string.format('%.17g %d', rate + 1 / C.RELEASE_TAU, ms))
  if rcall('EXISTS', base .. 'ring') == 0 then return 1 end
end
