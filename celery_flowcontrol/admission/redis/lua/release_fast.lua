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
  -- The release rate (release_rate.py's ReleaseRate) as a sum, in the hash relrate: field <e>, an
  -- epoch in ms (a multiple of C_RATE_EPOCH_MS), holds the sum over the releases at t in it of
  -- exp((t - e) / TAU) / TAU, in whole units of 1 / C_RATE_UNIT (codec.py says why), so a
  -- release adds its own term in one write, and the decayed count at now is the sum of
  -- value / C_RATE_UNIT * exp((e - now) / TAU) (release_rate.lua). The clock is keys.lua's,
  -- read here early.
  local ms = ARGV[5]
  if ms == '' then
    local t = rcall('TIME')
    ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  else
    ms = tonumber(ms)
  end
  local rr, epoch = base .. 'relrate', ms - ms % C_RATE_EPOCH_MS
  local term = math.floor(math.exp((ms - epoch) / (1000 * C_RELEASE_TAU)) / C_RELEASE_TAU
                          * C_RATE_UNIT + 0.5)
  if rcall('HINCRBY', rr, string.format('%d', epoch), string.format('%d', term)) == term then
    -- The epoch's first release: drop the epochs that weigh nothing any more.
    for _, e in ipairs(rcall('HKEYS', rr)) do
      if tonumber(e) < epoch - C_RATE_KEEP_MS then rcall('HDEL', rr, e) end
    end
  end
  if rcall('EXISTS', base .. 'ring') == 0 then return 1 end
end
