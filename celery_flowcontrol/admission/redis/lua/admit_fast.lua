-- admit_fast.lua: admit.lua's start, and its fast path. Sent before the modules only the full
-- decision needs (scripts.py): each "local function" a script passes costs every call a
-- closure, and most admissions end here. Arguments and replies: admit.lua.
--
-- The fast path: nothing due, no waiter at all, nobody in the rate line, the task neither
-- busy nor granted, a free slot, its key below its cap, and every rate limit and backoff
-- letting it in (quota_check, with the windows' own maths). The full decision would then
-- expire nothing, lease, and admit at once (no waiter to serve first, no line to bump): this
-- does just that. Otherwise admit.lua decides, on S, NOW and DIRTY as this left them: what
-- the checks wrote (a sliding log's trim, S.nd) the full decision would write as well.

if not load() then return C.UNKNOWN end
-- T: the ticket, admit.lua's too.
local T = {task = ARGV[6], inst = ARGV[7], prio = tonumber(ARGV[8]), key = ARGV[9],
           label = ARGV[10], cost = tonumber(ARGV[12])}
if not check_cost(T.cost) then return C.COST_REFUSED end
if S.nw == 0 and S.nr == 0 and nothing_due()
    and not call('HGET', K.slots, ':' .. T.task)
    and (S.ng == 0 or call('HEXISTS', K.grants, T.task) == 0)
    and free() > 0 and not saturated(T.key) and quota_check(T) == nil then
  local charge = quota_consume(T)
  -- Settle needs no record of a call charged 1 in per-call windows only (settle.lua).
  if T.cost == 1 and S.cmax == nil then charge = nil end
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
