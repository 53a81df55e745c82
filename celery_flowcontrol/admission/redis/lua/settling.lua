-- settling.lua: correct what one admission charged, and offer a refund's room to a waiter
-- (admission/settling.py, QuotaSteps). Needs every module queue_state.lua needs, and it.

-- Room came back in the rate limits (QuotaSteps._offer): the oldest pending grant is
-- announced again (a 7th field, the announcement's number, keeps the copy distinct), or a
-- queue without a concurrency cap grants its next waiter.
local function offer()
  local first = call('ZRANGE', K.gexp, 0, 0)
  if #first > 0 then
    set('ann', (S.ann or 0) + 1)
    announce(gunpack(first[1], call('HGET', K.grants, first[1])), S.ann)
  elseif capacity() == nil then
    local w = next_waiter()
    if w ~= nil then grant(w) end
  end
end

-- QuotaSteps.settle: correct the cost charged when slot *id* was admitted to *actual*; the
-- correction made, nil if the slot is not busy, false if it was settled already.
local function settle_slot(id, actual)
  local s = call('HGET', K.slots, id)
  if not s then return nil end
  local sl = sunpack(id, s)
  local ch = sl.charge or {cost = 1}
  if ch.st then return false end
  if quota_settle(ch, sl.key, actual) then offer() end
  sl.charge = ch
  call('HSET', K.slots, id, spack(sl))
  return actual - ch.cost
end
