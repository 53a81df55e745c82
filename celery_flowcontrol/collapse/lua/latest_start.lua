-- latest_start.lua: a call of a latest-wins key is about to run: take the key's run lease if the
-- call is still the newest and no other run holds the lease.
-- KEYS[1]  the key's hash (latest_claim.lua names its fields)
-- ARGV[1]  the starting task id
-- ARGV[2]  the run lease in milliseconds (renewed while the run lasts: a killed node's lapses)
-- ARGV[3]  the newest call's time to live in milliseconds, when the key has lapsed and this
--          call becomes the newest known
-- Returns  {"replaced", newest task id}: a newer call came, this one must not run;
--          {"busy", runner's task id}: an older run still holds the lease, try again later;
--          {"run", ""}: the lease is this call's
local rkey = KEYS[1]
local task_id = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', rkey, 'latest', 'run', 'run_until')
if h[1] and h[1] ~= task_id then
  return {'replaced', h[1]}
end
if h[2] and h[2] ~= task_id and tonumber(h[3] or '0') > now then
  return {'busy', h[2]}
end
-- The newest (or, the key lapsed, the newest known): a redelivered run goes on as Celery's
-- at-least-once delivery would, so its call is not done.
redis.call('HSET', rkey, 'latest', task_id, 'done', '0', 'run', task_id,
           'run_until', tostring(now + lease_ms))
local pttl = redis.call('PTTL', rkey)
if pttl < 0 then
  pttl = ttl_ms
end
redis.call('PEXPIRE', rkey, math.max(pttl, lease_ms))
return {'run', ''}
