-- pending_grants.lua: RedisBackend.pending_grants for one queue, grants not confirmed yet.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- Returns   {{task id, slot id, granted_at, expires_at}, ...} (Python sorts them),
--           or -1 if the queue is unknown.
if call('EXISTS', K.cfg) == 0 then return C_UNKNOWN end
local all = call('HGETALL', K.grants)
local out = {}
for i = 1, #all, 2 do
  local g = gunpack(all[i], all[i + 1])
  out[#out + 1] = {all[i], g.id, fmt(g.granted), fmt(g.exp)}
end
return out
