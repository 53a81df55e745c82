-- would_refuse.lua: RedisBackend.would_refuse, the refusal a new call of one key would meet
-- now (TenantSteps.refusal). Reads only.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   the key
-- Returns   {bound, "q" | "o" | "d"} (tenants.lua's refusal), {} if none, or -1 if the
--           queue is unknown.
if not load() then return C_UNKNOWN end
return refusal(ARGV[6]) or {}
