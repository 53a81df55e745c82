-- busy_slots.lua: RedisBackend.busy_slots, every held slot (Python sorts them).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- Returns   {{slot id, holder, task id, key, label, acquired_at, expires_at or ""}, ...},
--           or -1 if the queue is unknown.
if call('EXISTS', K.cfg) == 0 then return C_UNKNOWN end
local all = call('HGETALL', K.slots)
local out = {}
for i = 1, #all, 2 do
  if sub(all[i], 1, 1) ~= ':' then out[#out + 1] = slot_reply(sunpack(all[i], all[i + 1])) end
end
return out
