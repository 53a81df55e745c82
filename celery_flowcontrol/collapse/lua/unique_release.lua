-- unique_release.lua: free a collapse key, only if the given call holds it.
-- KEYS[1]  the claim's redis key
-- ARGV[1]  the task id that should hold it
-- Returns  1 if the key was freed, 0 if another call (or none) held it.
local rkey = KEYS[1]
local task_id = ARGV[1]

if redis.call('GET', rkey) == task_id then
  return redis.call('DEL', rkey)
end
return 0
