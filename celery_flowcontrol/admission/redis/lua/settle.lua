-- settle.lua: RedisBackend.settle, correct what one admission charged (QueueState.settle).
-- Follows keys.lua (KEYS, common ARGV, key layout); prelude.lua, quota.lua and
-- queue_state.lua at its top.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   slot id             ARGV[7]  the actual cost (checked by the caller: >= 0, finite)
-- Returns   0 if the slot is not busy (or the queue unknown), -3 if it was settled already
--           (nothing changed either way); else {actual - cost, announcement...}: a refund's
--           room offered to a waiter (queue_state.lua's offer) is announced there too, for the
--           settling process to deliver to its own listeners at once.
if not load() then return 0 end
local id, actual = ARGV[6], tonumber(ARGV[7])
local s = call('HGET', K.slots, id)
if not s then return 0 end
local sl = sunpack(id, s)
local ch = sl.charge or {cost = 1}
if ch.st then return -3 end
if quota_settle(ch, sl.key, actual) then offer() end
sl.charge = ch
call('HSET', K.slots, id, spack(sl))
save()
local reply = {fmt(actual - ch.cost)}
for i, payload in ipairs(ANNOUNCED) do reply[i + 1] = payload end
return reply
