-- unique_claim.lua: claim a collapse key for a call, or learn which call holds it.
-- KEYS[1]  the claim's redis key (<prefix>:unique:<key> or <prefix>:debounce:<key>)
-- ARGV[1]  the claiming call's task id
-- ARGV[2]  time to live in milliseconds (a crashed holder can't keep the key for good)
-- Returns  the task id holding the key after the call: ARGV[1] if it was free (now claimed)
--          or already its own (its TTL then starts again: a retry, a redelivery), else the
--          first call's id, untouched.
local rkey = KEYS[1]
local task_id = ARGV[1]
local ttl_ms = tonumber(ARGV[2])

local holder = redis.call('GET', rkey)
if holder and holder ~= task_id then
  return holder
end
redis.call('SET', rkey, task_id, 'PX', ttl_ms)
return task_id
