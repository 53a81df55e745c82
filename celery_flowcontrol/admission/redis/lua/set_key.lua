-- set_key.lua: RedisBackend.set_key and reset_key, one key's run-time override set or dropped
-- (TenantSteps.set_key / reset_key): the key's rules resolved again, lines regrouped if that
-- changes their grouping, its windows restarted if its limits changed (a backoff stays), its
-- line moved if its reserve did, and a cap raised grants at once.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   the key    ARGV[7]  its new override (JSON of the fields set), "" for none
-- ARGV[8]   the override the caller read and built on ("" for none)
-- Returns   1; C.CONFLICT (-4) if the stored override is not ARGV[8] any more (nothing
--           changed: the caller reads it again); or -1 if the queue is unknown.
if not load() then return C.UNKNOWN end
local key = ARGV[6]
if (call('HGET', K.keyover, key) or '') ~= ARGV[8] then return C.CONFLICT end
local before = key_rules(key)
local was_grouped, was_counting = grouped(), counting()
if ARGV[7] == '' then call('HDEL', K.keyover, key) else call('HSET', K.keyover, key, ARGV[7]) end
resolve_key(key)
key_flags()
RULES[key] = nil
local after = key_rules(key)
track_counts(was_counting)
if was_grouped ~= grouped() and call('EXISTS', K.ring) == 1 then rebuild_lines() end
if after.ksig ~= before.ksig and call('EXISTS', kw_rkey(key)) == 1 then
  -- Quota.refit: fresh windows of the new limits; a backoff in force stays.
  local b = call('HGET', kw_rkey(key), 'b')
  local rkeys = {kw_rkey(key)}
  for i = 1, C.MAX_RATE_LIMITS do rkeys[#rkeys + 1] = kl_rkey(i, key) end
  call('DEL', unpack(rkeys))
  KEY_STATES[key] = nil
  local ks = key_state(key)
  ks.b, ks.dirty = tonumber(b), true
  key_save(ks)
end
recount(key)
grant_pass()
save()
return 1
