-- settle.lua: RedisBackend.settle, correct what one admission charged (QuotaSteps.settle).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   slot id             ARGV[7]  the actual cost (checked by the caller: >= 0, finite)
-- Returns   0 if the slot is not busy (or the queue unknown), C_SETTLED (-3) if it was
--           settled already (nothing changed either way); else {actual - cost,
--           announcement...}: a refund's room offered to a waiter (settling.lua's offer) is
--           announced there too, for the settling process to deliver to its own listeners.
if not load() then return 0 end
local done = settle_slot(ARGV[6], tonumber(ARGV[7]))
if done == nil then return 0 end
if done == false then return C_SETTLED end
save()
local reply = {fmt(done)}
for i, payload in ipairs(ANNOUNCED) do reply[i + 1] = payload end
return reply
