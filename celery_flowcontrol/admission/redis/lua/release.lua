-- release.lua: RedisBackend.release, free one slot and grant it on (QueueState.release).
-- The fast path first, on its own; then keys.lua (KEYS, common ARGV, key layout),
-- prelude.lua and queue_state.lua for the grant pass.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   slot id ("<queue>:<n>")
-- Returns   1 if the slot was busy and is free now, 0 otherwise (also for an unknown queue);
--           {1, <announcement>...} when freeing it granted slots on: each grant's pub/sub
--           payload, for the releasing process to deliver to its own listeners at once.

-- Drop the slot: keys.lua's drop_slot, written out inline (keep them in step) before any
-- function is defined, as admit.lua's fast path is. No waiter then means no grant to make.
do
  local call, id = redis.call, ARGV[6]
  local base = string.sub(KEYS[1], 1, -4)
  local slots = base .. 'slots'
  local s = call('HGET', slots, id)
  if not s then return 0 end  -- also when the queue does not exist
  local sl = cmsgpack.unpack(s)  -- {holder, task, key, label, acquired, expires|false, uncounted}
  call('HDEL', slots, id, ':' .. sl[2])
  if sl[6] then call('ZREM', base .. 'holds', id) end
  if not sl[7] then
    local keycount = base .. 'keycount'
    if call('HINCRBY', keycount, sl[3], -1) <= 0 then call('HDEL', keycount, sl[3]) end
  end
  call('SREM', base .. 'held:' .. sl[1], id)
  if call('EXISTS', base .. 'ring') == 0 then return 1 end
end

--@keys
--@prelude
--@quota
--@queue_state

load()
grant_pass()
save()
if #ANNOUNCED == 0 then return 1 end
local reply = {1}
for i, payload in ipairs(ANNOUNCED) do reply[i + 1] = payload end
return reply
