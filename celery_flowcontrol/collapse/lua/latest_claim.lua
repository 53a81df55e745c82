-- latest_claim.lua: make a call the newest of its latest-wins key (flow_unique_keep="latest").
-- KEYS[1]  the key's hash (<prefix>:latest:<key>): latest (the newest call's task id), done
--          ("1" once that call's run ended), run and run_until (the running call and the
--          millisecond instant its lease lapses, on Redis's clock)
-- ARGV[1]  the calling task id
-- ARGV[2]  the newest call's time to live in milliseconds (a lost call can't hold the key for good)
-- ARGV[3]  "" to claim whatever holds the key, else claim only if this task id is the newest
--          (a producer whose send failed gives the key back to the call it replaced)
-- Returns  {previous, runner}: the call this one replaces ("" when none: free, its run ended, or
--          itself) and the call whose run holds the lease ("" when none)
local rkey = KEYS[1]
local task_id = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local only_if = ARGV[3]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', rkey, 'latest', 'done', 'run', 'run_until')
if only_if ~= '' and h[1] ~= only_if then
  return {'', ''}
end
local previous = ''
if h[1] and h[1] ~= task_id and h[2] ~= '1' then
  previous = h[1]
end
local runner = ''
local run_left = 0
if h[3] and tonumber(h[4] or '0') > now then
  runner = h[3]
  run_left = tonumber(h[4]) - now
end
redis.call('HSET', rkey, 'latest', task_id, 'done', '0')
redis.call('PEXPIRE', rkey, math.max(ttl_ms, run_left))
return {previous, runner}
