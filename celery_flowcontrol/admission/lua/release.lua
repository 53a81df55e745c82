-- release.lua: RedisBackend.release, free one slot and grant it on (QueueState.release).
-- Follows keys.lua (KEYS, common ARGV, key layout); prelude.lua and queue_state.lua after
-- the fast path, which needs only the slot store of keys.lua.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   slot id ("<queue>:<n>")
-- Returns   1 if the slot was busy and is free now, 0 otherwise (also for an unknown queue).
if drop_slot(ARGV[6]) == nil then return 0 end  -- also when the queue does not exist
-- Fast path: no waiter, so the grant pass has nobody to grant to.
if call('EXISTS', K.ring) == 0 then return 1 end

--@prelude
--@queue_state

load()
grant_pass()
save()
return 1
