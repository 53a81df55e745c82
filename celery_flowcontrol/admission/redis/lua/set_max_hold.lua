-- set_max_hold.lua: RedisBackend.set_max_hold, the operator's max_hold override.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   seconds (float repr, validated in Python), or "" to reset to the config
-- Returns   1, or -1 if the queue is unknown. Applies to slots granted from now on.
if not load() then return C_UNKNOWN end
set('ho', tonumber(ARGV[6]))
save()
return 1
