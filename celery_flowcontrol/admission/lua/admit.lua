-- admit.lua: RedisBackend.try_admit, one whole admission decision (QueueState.admit).
-- Follows keys.lua (KEYS, common ARGV, key layout); prelude.lua at the top, queue_state.lua
-- after the fast path.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   task id            ARGV[7]  instance        ARGV[8]  priority (int)
-- ARGV[9]   fairness key       ARGV[10] label           ARGV[11] lazy expiry limit per kind
-- Returns   -1 if the queue is unknown;
--           "<slot id> <acquired_at> <expires_at or ->" admitted as asked (the fast path);
--           {1, slot id, holder, task id, key, label, acquired_at, expires_at or ""} admitted;
--           {0, retry_at, reason} denied ("rate", "concurrency" or "per_key").
--@prelude
if not load() then return UNKNOWN end
local t = {task = ARGV[6], inst = ARGV[7], prio = tonumber(ARGV[8]), key = ARGV[9],
           label = ARGV[10]}

-- Fast path: nothing due, no waiter at all, the task new to the queue, a free slot, its key
-- below its cap and the rate window open. The full decision below would then expire
-- nothing, lease, and admit at once (no waiter to serve first, no line to bump): do just
-- that, before the rest of the rules are even defined.
if call('EXISTS', K.ring) == 0 and nothing_due() and not call('HGET', K.slots, ':' .. t.task) then
  local granted = call('HLEN', K.grants)
  local cap = capacity()
  if (granted == 0 or call('HEXISTS', K.grants, t.task) == 0)
      and (cap == nil or cap - call('HLEN', K.slots) / 2 - granted > 0)
      and not saturated(t.key) and take_rate() then
    lease(t.inst)
    if S.fair == 'key' then set('vclock', S.vclock + 1) end  -- served(); no line to move
    count(t.key)
    local sl = {id = new_slot_id(), holder = t.inst, task = t.task, key = t.key,
                label = t.label, acquired = NOW, exp = hold_until()}
    add_slot(sl)
    save()
    -- The short reply: the caller knows the task, holder, key and label it asked with.
    return sl.id .. ' ' .. fmt(NOW) .. ' ' .. (sl.exp and fmt(sl.exp) or '-')
  end
end

--@queue_state

-- As MemoryBackend.try_admit: lazy expiry first, then the caller's lease, then the decision.
expire(tonumber(ARGV[11]))
lease(t.inst)
local reply = admit(t)
save()
return reply
