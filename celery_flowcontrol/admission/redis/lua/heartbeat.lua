-- heartbeat.lua: RedisBackend.heartbeat for one queue, renew an instance's lease.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   instance
-- Returns   1, or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
lease(ARGV[6])
save()
return 1
