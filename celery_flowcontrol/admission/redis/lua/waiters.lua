-- waiters.lua: RedisBackend.waiters, waiters in the order they will be served.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   limit
-- Returns   {{task id, priority, key, label, seq, instance, since, expires_at}, ...},
--           or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
return ordered_waiters(tonumber(ARGV[6]))
