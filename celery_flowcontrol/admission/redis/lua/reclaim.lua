-- reclaim.lua: RedisBackend.reclaim for one queue, expire everything due (QueueState.expire).
-- Follows keys.lua (KEYS, common ARGV, key layout); prelude.lua and queue_state.lua at its top.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   limit per kind, or "" for no limit
-- Returns   {instances' slots freed, slots past max_hold, grants passed on, waiters pruned},
--           or -1 if the queue is unknown.
if not load() then return UNKNOWN end
local report = expire(tonumber(ARGV[6]))
save()
return report
