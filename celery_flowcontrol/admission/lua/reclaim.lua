-- reclaim.lua: RedisBackend.reclaim for one queue, expire everything due (QueueState.expire).
-- Runs after prelude.lua and queue_state.lua (KEYS, common ARGV, key layout: prelude.lua).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   limit per kind, or "" for no limit
-- Returns   {instances' slots freed, slots past max_hold, grants passed on, waiters pruned},
--           or -1 if the queue is unknown.
if not load() then return UNKNOWN end
local report = expire(tonumber(ARGV[6]))
save()
return report
