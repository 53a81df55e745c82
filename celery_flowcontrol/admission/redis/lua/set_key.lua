-- set_key.lua: RedisBackend.set_key and reset_key, one key's run-time override set or dropped
-- (TenantSteps.set_key / reset_key): the key's rules resolved again, lines regrouped if that
-- changes their grouping, its windows restarted if its limits changed (a backoff stays), its
-- line placed again if its weight or reserve did, and a cap raised grants at once.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   the key    ARGV[7]  its new override (JSON of the fields set), "" for none
-- ARGV[8]   the override the caller read and built on ("" for none)
-- Returns   1; C_CONFLICT (-4) if the stored override is not ARGV[8] any more (nothing
--           changed: the caller reads it again); or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
local key = ARGV[6]
if (call('HGET', K.keyover, key) or '') ~= ARGV[8] then return C_CONFLICT end
local before = key_rules(key)
local was_grouped, was_counting = grouped(), counting()
if ARGV[7] == '' then call('HDEL', K.keyover, key) else call('HSET', K.keyover, key, ARGV[7]) end
resolve_key(key)
key_flags()
track_counts(was_counting)
if was_grouped ~= grouped() and call('EXISTS', K.ring) == 1 then rebuild_lines() end
refit_key(key, before.ksig)
rekey(key)
grant_pass()
save()
return 1
