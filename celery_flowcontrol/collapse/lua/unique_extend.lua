-- unique_extend.lua: set a held collapse key's time to live, only if the given call holds it.
-- KEYS[1]  the claim's redis key
-- ARGV[1]  the task id that should hold it
-- ARGV[2]  the new time to live in milliseconds
-- Returns  1 if the key is held by ARGV[1] (its TTL set), 0 otherwise.
local rkey = KEYS[1]
local task_id = ARGV[1]
local ttl_ms = tonumber(ARGV[2])

if redis.call('GET', rkey) == task_id then
  return redis.call('PEXPIRE', rkey, ttl_ms)
end
return 0
