-- unregister.lua: RedisBackend.unregister, forget a queue with all its state.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   "1": only if idle (no busy slot, grant or waiter), checked in this same step
-- Returns   1 if the queue existed and is gone, 0 if not. (The caller updates the registry.)
if call('EXISTS', K.cfg) == 0 then return 0 end
if ARGV[6] == '1' and (call('EXISTS', K.slots) == 1 or call('EXISTS', K.grants) == 1
                       or call('EXISTS', K.waiting) == 1) then
  return 0
end
local doomed = {}
clock()  -- the recent admissions' buckets (tenants.lua) go too
local bucket = math.floor(NOW / C_RECENT_BUCKET)
for b = bucket - 1, bucket do doomed[#doomed + 1] = BASE .. 'adm:' .. string.format('%d', b) end
for _, instance in ipairs(call('ZRANGE', K.leases, 0, -1)) do
  doomed[#doomed + 1] = held_rkey(instance)
end
local all = call('HGETALL', K.slots)  -- holders whose lease is gone already, to be thorough
for i = 1, #all, 2 do
  if sub(all[i], 1, 1) ~= ':' then
    doomed[#doomed + 1] = held_rkey(sunpack(all[i], all[i + 1]).holder)
  end
end
for _, gk in ipairs(call('HKEYS', K.ringent)) do doomed[#doomed + 1] = line_rkey(gk) end
for _, part in ipairs({'cfg', 'leases', 'slots', 'holds', 'keycount', 'grants', 'gexp',
                       'waiting', 'wexp', 'ring', 'ringent', 'vtime', 'vidle', 'rline',
                       'rlined', 'relrate', 'keyset', 'keyconf', 'keyover', 'kbound', 'paused',
                       'kbo'}) do
  doomed[#doomed + 1] = K[part]
end
for i = 1, C_MAX_RATE_LIMITS do doomed[#doomed + 1] = rate_rkey(i) end
-- Every fairness key's windows (quota.lua's kidx lists them), then the index itself.
for _, member in ipairs(call('ZRANGE', K.kidx, 0, -1)) do
  for _, rkey in ipairs(key_state_rkeys(member)) do doomed[#doomed + 1] = rkey end
end
doomed[#doomed + 1] = K.kidx
-- UNLINK, not DEL: a queue with 100,000 keys of its own has hashes that size, which DEL would
-- free here, holding Redis for a good part of a second; UNLINK frees them in the background.
-- In chunks: unpack() of a very long list would overflow Lua's C stack.
for i = 1, #doomed, 500 do
  call('UNLINK', unpack(doomed, i, math.min(i + 499, #doomed)))
end
return 1
