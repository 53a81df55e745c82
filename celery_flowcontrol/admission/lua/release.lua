-- release.lua: RedisBackend.release, free one slot and grant it on (QueueState.release).
-- Runs after queue_state.lua (KEYS, common ARGV and key layout are described there).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   slot id ("<queue>:<n>")
-- Returns   1 if the slot was busy and is free now, 0 otherwise (also for an unknown queue).
if not load() then return 0 end
if drop_slot(ARGV[6]) == nil then return 0 end
grant_pass()
save()
return 1
