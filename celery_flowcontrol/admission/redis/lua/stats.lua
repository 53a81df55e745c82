-- stats.lua: RedisBackend.stats, what an operator sees of one queue.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- Returns   {config JSON, capacity override or "", max_hold override or "", slots in use,
--            grants, waiters, {{use, live or ""} per rate limit}, backoff end or "", the
--            operator's rate limits (JSON) or "", the queue's pause end or "" ("inf": no
--            end), max_waiting or "", refusals counted}, or -1
--           if the queue is unknown. Reading the rate use rolls/trims the windows at now, as
--           the reference does.
if not load() then return C_UNKNOWN end
local uses = quota_uses()
local bo = ''
if S.bo ~= nil and S.bo > NOW then bo = fmt(S.bo) end
save()
return {call('HGET', K.cfg, 'json'), S.co and fmt(S.co) or '', S.ho and fmt(S.ho) or '',
        call('HLEN', K.slots) / 2, call('HLEN', K.grants), call('HLEN', K.waiting), uses, bo,
        S.rover or '', (S.pu ~= nil and S.pu > NOW) and fmt(S.pu) or '',
        S.mw and fmt(S.mw) or '', S.nref or 0}
