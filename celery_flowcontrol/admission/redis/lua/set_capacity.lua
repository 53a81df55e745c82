-- set_capacity.lua: RedisBackend.set_capacity, the operator's capacity override.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   the override (int, validated in Python), or "" to reset to the config
-- Returns   1, or -1 if the queue is unknown. A raise grants waiters at once.
if not load() then return C_UNKNOWN end
set('co', tonumber(ARGV[6]))
grant_pass()
save()
return 1
