-- admit.lua: RedisBackend.try_admit, one whole admission decision (QueueState.admit).
-- The fast path first, on its own; then keys.lua (KEYS, common ARGV, key layout),
-- prelude.lua and queue_state.lua, and the full decision.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   task id            ARGV[7]  instance        ARGV[8]  priority (int)
-- ARGV[9]   fairness key       ARGV[10] label           ARGV[11] lazy expiry limit per kind
-- ARGV[12]  cost ("1" for the default)
-- Returns   -1 if the queue is unknown; -2 if the cost is above what a per-cost limit admits
--           (nothing changed);
--           "<slot id> <acquired_at> <expires_at or ->" admitted as asked (the fast path);
--           {1, slot id, holder, task id, key, label, acquired_at, expires_at or ""} admitted;
--           {0, retry_at, reason} denied ("rate", "concurrency", "per_key" or "backoff").

-- Fast path: nothing due, no waiter at all, the task new to the queue, a free slot, its key
-- below its cap, its cost within every per-cost limit, no adaptive limit and no per-cost
-- sliding log per key (S.fx), nobody in the rate line, no backoff in force of the queue or
-- the key, and every rate window open, the key's too.
-- The full decision would then expire nothing, lease, and admit at once (no waiter to serve
-- first, no line to bump): do just that. It is written out inline, before keys.lua: every
-- function a script defines costs each call its closure, and most admissions take this path.
-- It is prelude.lua's load, nothing_due, capacity, saturated, quota.lua's win_retry and
-- win_consume (quota_consume's charge), lease, count, new_slot_id, max_hold_until, add_slot and save,
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
  local cost = tonumber(ARGV[12])
  local fast = S.nw == 0 and S.fx and S.nr == 0 and (S.cmax == nil or cost <= S.cmax)
               and (S.bo == nil or S.bo <= now) and (S.kb == nil or S.kb <= now)
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
      -- quota.lua's win_retry for every window, then win_consume for every one (no window
      -- here is adaptive: S.fx). Only the sliding trims write before the admission is
      -- certain, as the full decision's trims would.
      local open, rw, counts = true, S.rw or {}, {}
      for i, W in ipairs(rw) do
        local c = 1
        if W.c then c = cost end
        if W.a == 'fixed' then
          local window = math.floor(math.floor(now * 1e6 + 0.5)  -- as quota.lua's roll
                                    / math.max(1, math.floor(W.p * 1e6 + 0.5)))
          local n = W.n
          if window ~= W.w then n = 0 end
          open = n + c <= W.l
          counts[i] = {window, n + c}
        elseif W.a == 'sliding' then
          local log, edge = base .. 'rate:' .. i, '(' .. format('%.17g', now - W.p)
          if W.c then  -- quota.lua's trim of a per-cost log: the sum follows what leaves it
            local gone = call('ZRANGEBYSCORE', log, '-inf', edge)
            for _, m in ipairs(gone) do W.s = W.s - tonumber(string.sub(m, 15)) end
            if #gone > 0 then
              call('ZREMRANGEBYSCORE', log, '-inf', edge)
              fDIRTY = true
            end
            if W.s ~= 0 and call('EXISTS', log) == 0 then W.s, fDIRTY = 0, true end
            open = W.s + c <= W.l
          else
            call('ZREMRANGEBYSCORE', log, '-inf', edge)
            open = call('ZCARD', log) + 1 <= W.l
          end
        else
          open = now >= W.tat - W.p / W.l * (W.b - c)
        end
        if not open then break end
      end
      -- The key's own windows (quota.lua's key_state; none is a per-cost sliding log here:
      -- S.fx), read once, and its backoff.
      local kw, kh, kst, kcounts = S.kw, nil, {}, {}
      if open and kw ~= nil then
        kh = base .. 'kw:' .. S.kg .. ':' .. key
        local raw, h = call('HGETALL', kh), {}
        for i = 1, #raw, 2 do h[raw[i]] = tonumber(raw[i + 1]) end
        open = h.b == nil or h.b <= now
        kst.b = h.b
        for i, W in ipairs(kw) do
          if not open then break end
          local c = 1
          if W.c then c = cost end
          local st = {w = h['w' .. i] or -1, n = h['n' .. i] or 0, tat = h['t' .. i] or 0,
                      q = h['q' .. i] or 0}
          kst[i] = st
          if W.a == 'fixed' then
            local window = math.floor(math.floor(now * 1e6 + 0.5)
                                      / math.max(1, math.floor(W.p * 1e6 + 0.5)))
            local n = st.n
            if window ~= st.w then n = 0 end
            open = n + c <= W.l
            kcounts[i] = {window, n + c}
          elseif W.a == 'sliding' then
            local log = base .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key
            call('ZREMRANGEBYSCORE', log, '-inf', '(' .. format('%.17g', now - W.p))
            open = call('ZCARD', log) + 1 <= W.l
          else
            open = now >= st.tat - W.p / W.l * (W.b - c)
          end
        end
      end
      local charge = nil  -- what settle needs: kept where a cost counts (quota_consume)
      if open then
        local toks, ktoks, keep = {}, {}, cost ~= 1
        for i, W in ipairs(rw) do
          local c = 1
          if W.c then
            c = cost
            keep = true
          end
          if W.a == 'fixed' then
            W.w, W.n = counts[i][1], counts[i][2]
            toks[i] = W.w
          elseif W.a == 'sliding' then
            W.q = W.q + 1
            local member = format('%014x', W.q)
            if W.c then
              member = member .. format('%.17g', c)
              W.s = W.s + c
            end
            call('ZADD', base .. 'rate:' .. i, format('%.17g', now), member)
            toks[i] = W.q
          else
            W.tat = math.max(W.tat, now) + W.p / W.l * c
            toks[i] = 0
          end
        end
        if kw ~= nil then  -- quota.lua's win_consume on the key's windows, then key_save
          local fields, fin = {}, kst.b or -math.huge
          for i, W in ipairs(kw) do
            local c, st, e = 1, kst[i], nil
            if W.c then
              c = cost
              keep = true
            end
            if W.a == 'fixed' then
              st.w, st.n = kcounts[i][1], kcounts[i][2]
              ktoks[i], e = st.w, (st.w + 1) * W.p
              fields[#fields + 1], fields[#fields + 2] = 'w' .. i, format('%.17g', st.w)
              fields[#fields + 1], fields[#fields + 2] = 'n' .. i, format('%.17g', st.n)
            elseif W.a == 'sliding' then
              st.q = st.q + 1
              call('ZADD', base .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key, format('%.17g', now),
                   format('%014x', st.q))
              ktoks[i], e = st.q, now + W.p
              fields[#fields + 1], fields[#fields + 2] = 'q' .. i, format('%.17g', st.q)
            else
              st.tat = math.max(st.tat, now) + W.p / W.l * c
              ktoks[i], e = 0, st.tat
              fields[#fields + 1], fields[#fields + 2] = 't' .. i, format('%.17g', st.tat)
            end
            if e > fin then fin = e end
          end
          call('HSET', kh, unpack(fields))
          call('ZADD', base .. 'kidx', format('%.17g', fin), S.kg .. ':' .. key)
          local ttl = 60000  -- quota.lua's KEY_MARGIN_MS
          if fin > now then ttl = ttl + math.ceil((fin - now) * 1000) end
          call('PEXPIRE', kh, ttl)
          for i, W in ipairs(kw) do
            if W.a == 'sliding' then
              call('PEXPIRE', base .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key, ttl)
            end
          end
        end
        if keep then charge = {cost = cost, t = toks, k = ktoks, e1 = S.rg, e2 = S.kg} end
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
        call('HSET', slots, id, cmsgpack.pack({inst, task, key, ARGV[10], now, exp,
                                               uncounted or false, charge or false}),
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
--@quota
--@queue_state

-- As MemoryBackend.try_admit: the cost first, lazy expiry, the caller's lease, the decision.
S, NOW, DIRTY = fS, fNOW, fDIRTY
if S.fx == nil then  -- a state from before quotas (prelude.lua's load)
  DIRTY = true
  configure_rates(call('HGET', K.cfg, 'json'))
end
local t = {task = ARGV[6], inst = ARGV[7], prio = tonumber(ARGV[8]), key = ARGV[9],
           label = ARGV[10], cost = tonumber(ARGV[12])}
if not check_cost(t.cost) then
  save()
  return -2
end
expire(tonumber(ARGV[11]))
lease(t.inst)
local reply = admit(t)
save()
return reply
