-- latest_extend.lua: renew a running call's lease on its latest-wins key.
-- KEYS[1]  the key's hash (latest_claim.lua names its fields)
-- ARGV[1]  the running task id
-- ARGV[2]  the lease in milliseconds from now
-- Returns  1 if ARGV[1] holds the lease (renewed), 0 otherwise.
local rkey = KEYS[1]
local task_id = ARGV[1]
local lease_ms = tonumber(ARGV[2])

if redis.call('HGET', rkey, 'run') ~= task_id then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', rkey, 'run_until', tostring(now + lease_ms))
if redis.call('PTTL', rkey) < lease_ms then
  redis.call('PEXPIRE', rkey, lease_ms)
end
return 1
