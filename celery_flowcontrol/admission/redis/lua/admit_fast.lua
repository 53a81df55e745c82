-- admit_fast.lua: admit.lua's start, and its fast path. Sent before the modules only the full
-- decision needs (scripts.py): each "local function" a script passes costs every call a
-- closure, dearer the more outer names it reads, and most admissions end here. Arguments
-- and replies: admit.lua.
--
-- The fast path: nothing due, no waiter at all, nobody in the rate line, no backoff in force
-- (of the queue or of any key: S.kb), the task neither busy nor granted, a free slot, its key
-- below its cap, and every window of the queue and of its key open (windows.lua's
-- win_retry). The full decision would then expire nothing, lease, and admit at once (no
-- waiter to serve first, no line to bump): this does just that, charging as quota.lua's
-- quota_consume does. Otherwise admit.lua decides, on S, NOW and DIRTY as this left them:
-- what the checks wrote (a sliding log's trim, S.nd) the full decision writes as well.

if not load() then return C.UNKNOWN end
-- T: the ticket, admit.lua's too.
local T = {task = ARGV[6], inst = ARGV[7], prio = tonumber(ARGV[8]), key = ARGV[9],
           label = ARGV[10], cost = tonumber(ARGV[12])}
if S.cmax ~= nil and T.cost > S.cmax then return C.COST_REFUSED end  -- quota.lua's check_cost
do
  local open = S.nw == 0 and S.nr == 0 and (S.bo == nil or S.bo <= NOW)
               and (S.kb == nil or S.kb <= NOW) and nothing_due()
               and not call('HGET', K.slots, ':' .. T.task)
               and (S.ng == 0 or call('HEXISTS', K.grants, T.task) == 0)
               and free() > 0 and not saturated(T.key)
  for i, w in ipairs(S.rw or {}) do
    if not open then break end
    open = win_retry(w, w, rate_rkey(i), charge_of(w, T.cost)) == nil
  end
  local ks = nil
  if open and S.kw ~= nil then
    ks = key_state(T.key)
    for i, c in ipairs(S.kw) do
      if not open then break end
      open = win_retry(c, ks.win[i], kl_rkey(i, T.key), charge_of(c, T.cost)) == nil
    end
  end
  if open then
    local toks, ktoks = {}, {}
    for i, w in ipairs(S.rw or {}) do
      toks[i] = win_consume(w, w, rate_rkey(i), charge_of(w, T.cost))
    end
    if ks ~= nil then
      for i, c in ipairs(S.kw) do
        ktoks[i] = win_consume(c, ks.win[i], kl_rkey(i, T.key), charge_of(c, T.cost))
      end
      key_save(ks)
    end
    -- Settle needs no record of a call charged 1 in per-call windows only (settle.lua).
    local charge = nil
    if T.cost ~= 1 or S.cmax ~= nil then
      charge = {cost = T.cost, t = toks, k = ktoks, e1 = S.rg, e2 = S.kg}
    end
    lease(T.inst)
    if S.fair == 'key' then set('vclock', S.vclock + 1) end  -- served(): no line to move
    -- keycount is read only under a per-key cap (keys.lua): count(), or mark the slot.
    local uncounted = nil
    if S.pkc == nil then uncounted = true else count(T.key) end
    local sl = {id = new_slot_id(), holder = T.inst, task = T.task, key = T.key, label = T.label,
                acquired = NOW, exp = max_hold_until(), uncounted = uncounted, charge = charge}
    add_slot(sl)
    save()
    -- The short reply: the caller knows the task, holder, key and label it asked with.
    return sl.id .. ' ' .. fmt(NOW) .. ' ' .. (sl.exp and fmt(sl.exp) or '-')
  end
end
