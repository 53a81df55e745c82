-- latest_finish.lua: a call of a latest-wins key ended (or goes on: a retry): free its run lease,
-- and learn whether a newer call replaced it (then its result is discarded).
-- KEYS[1]  the key's hash (latest_claim.lua names its fields)
-- ARGV[1]  the task id that ended
-- ARGV[2]  "1": its result is final (the newest call's run is done: a later call replaces
--          nothing); "0": the same call goes on (a retry, a backoff), still the newest
-- Returns  the newest call's task id when it is not ARGV[1], else "".
local rkey = KEYS[1]
local task_id = ARGV[1]
local ending = ARGV[2]

local h = redis.call('HMGET', rkey, 'latest', 'run')
if h[2] == task_id then
  redis.call('HDEL', rkey, 'run', 'run_until')
end
if h[1] and h[1] ~= task_id then
  return h[1]
end
if h[1] and ending == '1' then
  redis.call('HSET', rkey, 'done', '1')
end
return ''
