-- set_rate_limit.lua: RedisBackend.set_rate_limit, override a queue's rate limits or reset
-- them (QuotaSteps.set_rate_override).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   the limits as JSON (a list of RateLimit.to_dict, checked by the caller), or ""
--           to reset to config
-- Returns   1, or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
local rover = ARGV[6]
if rover == '' then rover = nil end
set('rover', rover)
configure_rates(call('HGET', K.cfg, 'json'))
save()
return 1
