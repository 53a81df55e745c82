-- backoff.lua: RedisBackend.backoff, pause a queue or one fairness key (Quota.backoff).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   seconds (checked by the caller: > 0, at most a day)
-- ARGV[7]   "1" for a key's backoff, "" for the queue's      ARGV[8]  the key
-- Returns   the end of the backoff in force (%.17g), or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
local key = nil
if ARGV[7] == '1' then key = ARGV[8] end
local untl = quota_backoff(tonumber(ARGV[6]), key)
save()
return fmt(untl)
