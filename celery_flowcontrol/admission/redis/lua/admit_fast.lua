-- admit_fast.lua: admit.lua's start, and its fast path (arguments and replies: admit.lua). Sent
-- right after keys.lua and windows.lua (scripts.py): Lua makes a closure of each "local function"
-- a script passes on every call, dearer the more outer names it reads, and a table of each table;
-- most admissions end here, so it writes out its redis keys (not key_table.lua's K) and the steps
-- of state.lua, busy.lua and key_windows.lua it takes (the state-machine test holds them to the
-- reference); the window maths is windows.lua's win.
--
-- The fast path: nothing due, no waiter at all, nobody in the rate line, no backoff or pause in
-- force (of the queue or of any key: S.kb, S.pu, S.kpu), the task neither busy nor granted, a free
-- slot, its key below its cap (its own, else per_key_concurrency), no per-cost sliding window of a
-- key (its trim would leave a sum to write back), and every window of the queue and of its key
-- open. The full decision would then expire nothing, lease, and admit at once (no waiter to serve
-- first, no line to bump): this does just that, charging as quota.lua's quota_consume does.
-- Otherwise admit.lua decides, on S, NOW and DIRTY as this left them: what the checks wrote (a
-- sliding log's trim, S.nd) the full decision writes as well.

do  -- state.lua's load() and clock()
  local blob = call('HGET', KEYS[1], 'S')
  if not blob then return C_UNKNOWN end
  S = cmsgpack.unpack(blob)
  if ARGV[5] == '' then
    local t = call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    NOW, NOW_MS = ms / 1000, string.format('%d', ms)
  else
    NOW, NOW_MS = tonumber(ARGV[5]) / 1000, ARGV[5]
  end
end
-- T: the ticket (admit.lua's), a table made only where the full decision takes over.
local T
do
  local task, inst, key, cost = ARGV[6], ARGV[7], ARGV[9], tonumber(ARGV[12])
  -- key_rules.lua's key_rules for the key: its own settings, else the per-key defaults.
  local conc, kw, cmax, ksig = S.pkc, S.kw, S.cmax, S.ksig
  if (S.nks or 0) > 0 then
    local raw = call('HGET', BASE .. 'keyset', key)
    if raw then
      local a = cmsgpack.unpack(raw)
      if a[2] then conc = a[2] end
      if a[5] then
        kw, ksig, cmax = a[5], a[6], S.qcmax
        if a[7] and (cmax == nil or a[7] < cmax) then cmax = a[7] end
      end
    end
  end
  if cmax ~= nil and cost > cmax then return C_COST_REFUSED end  -- quota.lua's check_cost
  do
    local open = S.nw == 0 and S.nr == 0 and (S.bo == nil or S.bo <= NOW)
                 and (S.kb == nil or S.kb <= NOW) and (S.pu == nil or S.pu <= NOW)
                 and (S.kpu == nil or S.kpu <= NOW)
    if open and (S.nd == nil or NOW >= S.nd) then  -- state.lua's nothing_due()
      local first = math.huge
      for _, part in ipairs({'leases', 'holds', 'gexp', 'wexp'}) do
        local e = call('ZRANGE', BASE .. part, 0, 0, 'WITHSCORES')
        if #e > 0 then
          local at = tonumber(e[2])
          if at <= NOW then
            open = false
            break
          end
          if at < first then first = at end
        end
      end
      if open then S.nd, DIRTY = first, true end
    end
    local cap = S.co  -- state.lua's capacity() and free(), busy.lua's saturated()
    if cap == nil then cap = S.cap end
    open = open and not call('HGET', BASE .. 'slots', ':' .. task)
           and (S.ng == 0 or call('HEXISTS', BASE .. 'grants', task) == 0)
           and (cap == nil or cap - call('HLEN', BASE .. 'slots') / 2 - S.ng > 0)
           and (conc == nil or (tonumber(call('HGET', BASE .. 'keycount', key)) or 0) < conc)
    -- The queue's sliding logs' names, made once: Lua prints a number with sprintf to join it.
    local rw, logs = S.rw, nil
    if rw ~= nil then
      logs = {}
      for i = 1, #rw do
        if not open then break end
        logs[i] = BASE .. 'rate:' .. i
        open = win('retry', rw[i], rw[i], logs[i], cost) == nil
      end
    end
    -- key_windows.lua's key_state: the key's windows, read once.
    local kst, rkey = nil, nil
    if open and kw ~= nil then
      kst = {}
      rkey = BASE .. 'kw:' .. S.kg .. ':' .. key
      local raw, h = call('HGETALL', rkey), {}
      for i = 1, #raw, 2 do h[raw[i]] = tonumber(raw[i + 1]) end
      kst.b = h.b
      for i, c in ipairs(kw) do
        if not open or (c.a == 'sliding' and c.c) then
          open = false
          break
        end
        kst[i] = {w = h['w' .. i] or -1, n = h['n' .. i] or 0, tat = h['t' .. i] or 0,
                  q = h['q' .. i] or 0, s = h['s' .. i] or 0}
        open = win('retry', c, kst[i], BASE .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key,
                   cost) == nil
      end
    end
    if open then
      -- Settle needs no record of a call charged 1 in per-call windows only (settle.lua): the
      -- windows' tokens are kept for a record only.
      local keep = cost ~= 1 or S.cmax ~= nil
      local toks, ktoks = false, false
      if rw ~= nil then
        if keep then toks = {} end
        for i = 1, #rw do
          local tok = win('consume', rw[i], rw[i], logs[i], cost)
          if keep then toks[i] = tok end
        end
      end
      if kw ~= nil then  -- 'consume' on the key's windows, then key_windows.lua's key_save
        if keep then ktoks = {} end
        local fields, fin = {}, kst.b or -math.huge
        for i, c in ipairs(kw) do
          local st, log = kst[i], BASE .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key
          local tok = win('consume', c, st, log, cost)
          if keep then ktoks[i] = tok end
          if c.a == 'fixed' then
            fields[#fields + 1], fields[#fields + 2] = 'w' .. i, fmt(st.w)
            fields[#fields + 1], fields[#fields + 2] = 'n' .. i, fmt(st.n)
          elseif c.a == 'gcra' then
            fields[#fields + 1], fields[#fields + 2] = 't' .. i, fmt(st.tat)
          else
            fields[#fields + 1], fields[#fields + 2] = 'q' .. i, fmt(st.q)
            fields[#fields + 1], fields[#fields + 2] = 's' .. i, fmt(st.s)
          end
          local e = win('end', c, st, log)
          if e > fin then fin = e end
        end
        call('HSET', rkey, unpack(fields))
        call('ZADD', BASE .. 'kidx', fmt(fin), S.kg .. ':' .. key)
        local ttl = C_KEY_MARGIN_MS
        if fin > NOW then ttl = ttl + math.ceil((fin - NOW) * 1000) end
        call('PEXPIRE', rkey, ttl)
        for i, c in ipairs(kw) do
          if c.a == 'sliding' then
            call('PEXPIRE', BASE .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key, ttl)
          end
        end
      end
      local charge = false
      if keep then
        charge = {cost = cost, t = toks or {}, k = ktoks or {}, e1 = S.rg, e2 = S.kg, ks = ksig}
      end
      -- busy.lua's lease(), count() (keycount is read only under a per-key cap: keys.lua) and
      -- add_slot() (no line to move: nobody waits, lines.lua's admit_new moves no tag);
      -- state.lua's new_slot_id(),
      -- max_hold_until() and save().
      local at = NOW + tonumber(ARGV[1])  -- INSTANCE_TTL (state.lua)
      call('ZADD', BASE .. 'leases', fmt(at), inst)
      if S.nd == nil or at < S.nd then S.nd, DIRTY = at, true end
      if S.fair == 'key' then  -- tenants.lua's admitted_now
        local adm = BASE .. 'adm:' .. string.format('%d', math.floor(NOW / C_RECENT_BUCKET))
        if call('HINCRBY', adm, key, 1) == 1 then call('PEXPIRE', adm, C_RECENT_TTL_MS) end
      end
      local uncounted = false
      if S.pkc == nil and not S.kx then
        uncounted = true
      else
        call('HINCRBY', BASE .. 'keycount', key, 1)
      end
      local id = S.name .. ':' .. string.format('%d', call('HINCRBY', KEYS[1], 'sseq', 1))
      local hold, exp = S.ho, false
      if hold == nil then hold = S.hold end
      if hold ~= nil then exp = NOW + hold end
      call('HSET', BASE .. 'slots', id, cmsgpack.pack({inst, task, key, ARGV[10], NOW, exp,
                                               uncounted, charge}), ':' .. task, id)
      if exp then
        call('ZADD', BASE .. 'holds', fmt(exp), id)
        if exp < S.nd then S.nd, DIRTY = exp, true end
      end
      call('SADD', BASE .. 'held:' .. inst, id)
      if DIRTY then call('HSET', KEYS[1], 'S', cmsgpack.pack(S)) end
      -- The short reply: the caller knows the task, holder, key and label it asked with.
      return id .. ' ' .. NOW_MS .. ' ' .. (exp and fmt(exp) or '-')
    end
  end
  T = {task = task, inst = inst, prio = tonumber(ARGV[8]), key = key, label = ARGV[10],
       cost = cost, conc = conc, kw = kw, cmax = cmax, ksig = ksig}
end
