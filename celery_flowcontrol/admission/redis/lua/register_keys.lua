-- register_keys.lua: RedisBackend.register's keys= entries, a chunk per call: the keys of a
-- big keys= written in one call would hold Redis for seconds, and each call here is atomic
-- and idempotent. Each key's keys= entry is set (or dropped: it left the config), its rules
-- resolved again with its set_key override on top (which still wins), its windows refitted
-- where its limits changed, its waiting line placed again (its weight or reserve may have
-- changed); lines regroup if that changes their grouping. The last call marks the generation
-- written in full and grants what the new settings allow (QueueState.configure + grant_pass,
-- which the reference does in one step).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   the generation of the config's keys= (register.lua's ARGV[16])
-- ARGV[7]   "1" on the last call, else ""
-- ARGV[8..] key, its entry (JSON of KeyConfig.to_dict), or "" if it left the config; pairs
-- Returns   1; 0 if another registration began since (nothing changed: that one writes its
--           own keys); or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
if S.kgen ~= ARGV[6] then return 0 end
local was_grouped, was_counting = grouped(), counting()
local old = {}
for i = 8, #ARGV, 2 do
  local key = ARGV[i]
  old[key] = key_rules(key).ksig
  if ARGV[i + 1] == '' then
    call('HDEL', K.keyconf, key)
  else
    call('HSET', K.keyconf, key, cmsgpack.pack(cjson.decode(ARGV[i + 1])))
  end
  resolve_key(key)
end
key_flags()
for key, sig in pairs(old) do refit_key(key, sig) end
track_counts(was_counting)
if was_grouped ~= grouped() and call('EXISTS', K.ring) == 1 then rebuild_lines() end
-- After any rebuild: register.lua rebuilt the lines with the keys' old settings, and a line
-- keeps the rank and reserve flag it was placed with until it is placed again.
for key in pairs(old) do rekey(key) end
if ARGV[7] == '1' then
  set('kdone', ARGV[6])
  grant_pass()
end
save()
return 1
