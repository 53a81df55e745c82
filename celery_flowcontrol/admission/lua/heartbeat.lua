-- heartbeat.lua: RedisBackend.heartbeat for one queue, renew an instance's lease.
-- Runs after queue_state.lua (KEYS, common ARGV and key layout are described there).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   instance
-- Returns   1, or -1 if the queue is unknown.
if call('EXISTS', K.cfg) == 0 then return UNKNOWN end
lease(ARGV[6])
return 1
