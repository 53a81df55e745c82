-- release.lua: RedisBackend.release, free one slot and grant it on (QueueState.release).
-- Sent after release_fast.lua, which frees the slot.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   slot id ("<queue>:<n>")
-- Returns   1 if the slot was busy and is free now, 0 otherwise (also for an unknown queue);
--           {1, <announcement>...} when freeing it granted slots on: each grant's pub/sub
--           payload, for the releasing process to deliver to its own listeners at once.
load()
grant_pass()
save()
if #ANNOUNCED == 0 then return 1 end
local reply = {1}
for i, payload in ipairs(ANNOUNCED) do reply[i + 1] = payload end
return reply
