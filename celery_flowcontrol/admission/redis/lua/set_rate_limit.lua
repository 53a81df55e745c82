-- set_rate_limit.lua: RedisBackend.set_rate_limit, override a queue's rate limits or reset
-- them (QueueState.set_rate_override).
-- Follows keys.lua (KEYS, common ARGV, key layout); prelude.lua, quota.lua and
-- queue_state.lua at its top.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   the limits as JSON (a list of RateLimit.to_dict, checked by the caller), or ""
--           to reset to config
-- Returns   1, or -1 if the queue is unknown.
if not load() then return UNKNOWN end
set('rover', opt(ARGV[6]))
configure_rates(call('HGET', K.cfg, 'json'))
save()
return 1
