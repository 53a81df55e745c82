-- reclaim.lua: RedisBackend.reclaim for one queue, expire everything due (QueueState.expire).
-- Sent after reclaim_fast.lua, which loads the queue and answers where nothing is due.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   limit per kind, or "" for no limit
-- Returns   {instances' slots freed, slots past max_hold, grants passed on, waiters pruned},
--           or -1 if the queue is unknown.
local report = expire(tonumber(ARGV[6]))
save()
return report
