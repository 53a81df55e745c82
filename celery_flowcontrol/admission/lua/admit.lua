-- admit.lua: RedisBackend.try_admit, one whole admission decision (QueueState.admit).
-- Runs after queue_state.lua (KEYS, common ARGV and key layout are described there).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   task id            ARGV[7]  instance        ARGV[8]  priority (int)
-- ARGV[9]   fairness key       ARGV[10] label           ARGV[11] lazy expiry limit per kind
-- Returns   -1 if the queue is unknown;
--           {1, slot id, holder, task id, key, label, acquired_at, expires_at or ""} admitted;
--           {0, retry_at, reason} denied ("rate", "concurrency" or "per_key").
if not load() then return UNKNOWN end
local t = {task = ARGV[6], inst = ARGV[7], prio = tonumber(ARGV[8]), key = ARGV[9],
           label = ARGV[10]}
-- As MemoryBackend.try_admit: lazy expiry first, then the caller's lease, then the decision.
expire(tonumber(ARGV[11]))
lease(t.inst)
local reply = admit(t)
save()
return reply
