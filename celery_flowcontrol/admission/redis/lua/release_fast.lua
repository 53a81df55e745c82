-- release_fast.lua: release.lua's start, and its fast path. Sent first (scripts.py), before
-- any module: each "local function" a script passes costs every call a closure, and most
-- releases end here. Arguments and replies: release.lua.
-- Frees the slot (slot_records.lua's drop_slot, written out); with no waiter in any line
-- there is no grant to make, and nothing else to read.
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
  if rcall('EXISTS', base .. 'ring') == 0 then return 1 end
end
