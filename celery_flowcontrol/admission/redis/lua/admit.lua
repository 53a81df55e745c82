-- admit.lua: RedisBackend.try_admit, one whole admission decision (QueueState.admit).
-- The fast path first, on its own; then keys.lua (KEYS, common ARGV, key layout),
-- prelude.lua and queue_state.lua, and the full decision.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   task id            ARGV[7]  instance        ARGV[8]  priority (int)
-- ARGV[9]   fairness key       ARGV[10] label           ARGV[11] lazy expiry limit per kind
-- Returns   -1 if the queue is unknown;
--           "<slot id> <acquired_at> <expires_at or ->" admitted as asked (the fast path);
--           {1, slot id, holder, task id, key, label, acquired_at, expires_at or ""} admitted;
--           {0, retry_at, reason} denied ("rate", "concurrency" or "per_key").

-- Fast path: nothing due, no waiter at all, the task new to the queue, a free slot, its key
-- below its cap and the rate window open. The full decision would then expire nothing,
-- lease, and admit at once (no waiter to serve first, no line to bump): do just that. It is
-- written out inline, before keys.lua: every function a script defines costs each call its
-- closure, and most admissions take this path. It is prelude.lua's load, nothing_due,
-- capacity, saturated, take_rate, lease, count, new_slot_id, max_hold_until, add_slot and save,
-- step for step (keep them in step). "No waiter" and the grant count come from S (S.nw,
-- S.ng: prelude.lua), not from Redis. Nothing is written before the admission is certain,
-- but the sliding log's trim (which the full decision makes too) and S, handed over.
local fS, fNOW, fDIRTY  -- what the full decision below takes over: S, NOW, DIRTY
do
  local call, cfg, format = redis.call, KEYS[1], string.format
  local base = string.sub(cfg, 1, -4)
  local blob = call('HGET', cfg, 'S')
  if not blob then return -1 end  -- UNKNOWN
  local S = cmsgpack.unpack(blob)
  local now
  if ARGV[5] == '' then
    local t = call('TIME')
    now = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) / 1000
  else
    now = tonumber(ARGV[5]) / 1000
  end
  fS, fNOW, fDIRTY = S, now, false
  local task, inst, key = ARGV[6], ARGV[7], ARGV[9]
  local slots, grants, keycount = base .. 'slots', base .. 'grants', base .. 'keycount'
  if S.nw == nil then  -- as load() does
    S.nw, S.ng, fDIRTY = call('HLEN', base .. 'waiting'), call('HLEN', grants), true
  end
  local fast = S.nw == 0
  if fast and (S.nd == nil or now >= S.nd) then  -- nothing_due()
    local first = math.huge
    for _, part in ipairs({'leases', 'holds', 'gexp', 'wexp'}) do
      local e = call('ZRANGE', base .. part, 0, 0, 'WITHSCORES')
      if #e > 0 then
        local at = tonumber(e[2])
        if at <= now then
          fast = false
          break
        end
        if at < first then first = at end
      end
    end
    if fast then S.nd, fDIRTY = first, true end
  end
  if fast and not call('HGET', slots, ':' .. task) then
    local granted = S.ng
    local cap = S.co
    if cap == nil then cap = S.cap end
    if (granted == 0 or call('HEXISTS', grants, task) == 0)
        and (cap == nil or cap - call('HLEN', slots) / 2 - granted > 0)
        and (S.pkc == nil or (tonumber(call('HGET', keycount, key)) or 0) < S.pkc) then
      local open, ra = true, S.ra  -- take_rate()
      if ra == 'fixed' then
        local window = math.floor(math.floor(now * 1e6 + 0.5)  -- as prelude.lua's fixed_roll
                                  / math.max(1, math.floor(S.rp * 1e6 + 0.5)))
        local fc = S.fc
        if window ~= S.fw then fc = 0 end
        open = fc < S.rl
        if open then S.fw, S.fc = window, fc + 1 end
      elseif ra == 'sliding' then
        local rate = base .. 'rate'
        call('ZREMRANGEBYSCORE', rate, '-inf', '(' .. format('%.17g', now - S.rp))
        open = call('ZCARD', rate) < S.rl
        if open then
          S.rseq = S.rseq + 1
          call('ZADD', rate, format('%.17g', now), format('%014x', S.rseq))
        end
      elseif ra ~= nil then
        local interval = S.rp / S.rl
        open = now >= S.tat - interval * (S.rb - 1)
        if open then S.tat = math.max(S.tat, now) + interval end
      end
      if open then
        local at = now + tonumber(ARGV[1])  -- lease(): instance_ttl
        call('ZADD', base .. 'leases', format('%.17g', at), inst)
        if S.nd == nil or at < S.nd then S.nd = at end
        if S.fair == 'key' then S.vclock = S.vclock + 1 end  -- served(); no line to move
        local uncounted = nil  -- count(), which only a per-key cap reads (keys.lua: keycount)
        if S.pkc == nil then uncounted = true else call('HINCRBY', keycount, key, 1) end
        S.sseq = S.sseq + 1
        local id = S.name .. ':' .. format('%d', S.sseq)
        local hold, exp = S.ho, false
        if hold == nil then hold = S.hold end
        if hold ~= nil then exp = now + hold end
        call('HSET', slots, id, cmsgpack.pack({inst, task, key, ARGV[10], now, exp, uncounted}),
             ':' .. task, id)
        if exp then
          call('ZADD', base .. 'holds', format('%.17g', exp), id)
          if exp < S.nd then S.nd = exp end
        end
        call('SADD', base .. 'held:' .. inst, id)
        call('HSET', cfg, 'S', cmsgpack.pack(S))
        -- The short reply: the caller knows the task, holder, key and label it asked with.
        return id .. ' ' .. format('%.17g', now) .. ' ' .. (exp and format('%.17g', exp) or '-')
      end
    end
  end
end

--@keys
--@prelude
--@queue_state

-- As MemoryBackend.try_admit: lazy expiry first, then the caller's lease, then the decision.
S, NOW, DIRTY = fS, fNOW, fDIRTY
local t = {task = ARGV[6], inst = ARGV[7], prio = tonumber(ARGV[8]), key = ARGV[9],
           label = ARGV[10]}
expire(tonumber(ARGV[11]))
lease(t.inst)
local reply = admit(t)
save()
return reply
