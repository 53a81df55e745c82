-- stats.lua: RedisBackend.stats, what an operator sees of one queue.
-- Follows keys.lua (KEYS, common ARGV, key layout); prelude.lua and queue_state.lua at its top.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- Returns   {config JSON, capacity override or "", max_hold override or "", slots in use,
--            grants, waiters, rate used}, or -1 if the queue is unknown. Reading the rate
--           use rolls/trims the window at now, as the reference does.
if not load() then return UNKNOWN end
local used = rate_used()
save()
return {call('HGET', K.cfg, 'json'), S.co and fmt(S.co) or '', S.ho and fmt(S.ho) or '',
        call('HLEN', K.slots) / 2, call('HLEN', K.grants), call('HLEN', K.waiting), used}
