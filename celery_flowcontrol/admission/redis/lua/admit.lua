-- admit.lua: RedisBackend.try_admit, one whole admission decision (QueueState.admit), as
-- MemoryBackend.try_admit: the cost first, lazy expiry, the caller's lease, the decision.
-- Sent after admit_fast.lua, which loads the state, checks the cost, takes the fast path
-- where it can and names the ticket T.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   task id            ARGV[7]  instance        ARGV[8]  priority (int)
-- ARGV[9]   fairness key       ARGV[10] label           ARGV[11] lazy expiry limit per kind
-- ARGV[12]  cost ("1" for the default)
-- Returns   C_UNKNOWN (-1) if the queue is unknown; C_COST_REFUSED (-2) if the cost is above
--           what a per-cost limit admits (nothing changed);
--           "<slot id> <acquired_at, whole ms> <expires_at or ->" admitted as asked (fast path);
--           {1, slot id, holder, task id, key, label, acquired_at, expires_at or ""} admitted;
--           {0, retry_at, reason} denied ("rate", "key-rate", "concurrency", "per_key" or
--           "backoff").
expire(tonumber(ARGV[11]))
lease(T.inst)
local reply = admit(T)
save()
return reply
