-- withdraw.lua: RedisBackend.withdraw, take a waiter out of line (QueueState.withdraw).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   task id
-- Returns   1 if it was waiting or held a grant (the grant passes on), 0 if not; -1 unknown queue.
if not load() then return C_UNKNOWN end
local task = ARGV[6]
local done = 0
unline(task)
if call('HEXISTS', K.grants, task) == 1 then
  drop_grant(task)
  grant_pass()
  done = 1
elseif dequeue(task) ~= nil then
  done = 1
end
save()
return done
