-- resume.lua: RedisBackend.resume, end the pause (and a backoff) of the queue or of one key;
-- its waiters are granted at once (TenantSteps.resume).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   "q" for the queue, "k" for a key     ARGV[7]  the key
-- Returns   1, or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
if ARGV[6] == 'q' then
  set('pu', nil)
  set('bo', nil)
else
  local key = ARGV[7]
  call('HDEL', K.paused, key)
  local last = nil
  for _, v in ipairs(call('HVALS', K.paused)) do
    local u = tonumber(v)
    if last == nil or u > last then last = u end
  end
  set('kpu', last)
  call('ZREM', K.kbo, key)
  local ks = key_state(key)
  if ks.b ~= nil then  -- Quota.end_key_backoff
    ks.b, ks.dirty = nil, true
    call('HDEL', kw_rkey(key), 'b')
    key_save(ks)
  end
end
grant_pass()
save()
return 1
