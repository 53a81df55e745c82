-- quota.lua: every rate limit of a queue, its per-key windows, backoffs and the rate line
-- (admission/quota.py and rate.py, step for step). Follows prelude.lua.
--
-- Layout (besides keys.lua's):
--   S.rw      the queue's windows, in rate_limit order: {a = algorithm, l = limit, p = period,
--             b = burst, c = true if per="cost", ad = true if adaptive, live, since (adaptive),
--             w, n (fixed: window number and count), tat (gcra), q (sliding: last seq),
--             s (sliding per cost: the sum)}; S.kw the per-key limits {a, l, p, b, c};
--             S.rg, S.kg their epochs (a charge made under another epoch is past); S.cmax the
--             largest cost a ticket may have; S.bo the queue's backoff end, S.kb the last
--             end of any key's (a key's own windows are read only while one may be in
--             force, or under per-key limits); S.nr the rate
--             line's length; S.fx true if admit.lua's fast path may decide (no adaptive
--             limit, no per-cost sliding log per key).
--   rate:<i>  zset  the queue's sliding window i: score time, member %014x seq, and for a
--                   per-cost window the charge after it (%.17g)
--   kw:<kg>:<key>   hash  one fairness key's windows: w<i>, n<i>, t<i>, q<i>, s<i> as above,
--                   b its backoff end; kl:<kg>:<i>:<key> zset its sliding logs.
--   kidx      zset  "<kg>:<key>" -> when that key's windows are empty again: each decision's
--                   lazy expiry deletes a few that are (Quota.prune), reclaim all of them,
--                   unregister every one; and each key's own keys expire a minute after that
--                   instant as well, so memory stays bounded whatever the number of keys
--                   (their meaning never depends on the TTL: the windows' arithmetic does).
--   rline     zset  the rate line: score since, member task id
--   rlined    hash  task id -> msgpack {since, cost, period, retry_at of its last denial}
local KEY_MARGIN_MS = 60000

local function charge_of(c, cost) if c.c then return cost end return 1 end

-- The live limit: adaptive limits regain a tenth of the ceiling per whole period (AIMD).
local function step(c) return math.max(1, math.floor(c.l / 10)) end
local function limit_at(c)
  if not c.ad then return c.l end
  if c.since == nil then
    c.since = NOW
    DIRTY = true
  end
  local n = math.floor((NOW - c.since) / c.p)
  if n > 0 then
    c.live = math.min(c.l, c.live + n * step(c))
    c.since = c.since + n * c.p
    DIRTY = true
  end
  return c.live
end

local function raised_at(c, charge)
  local live = limit_at(c)
  return c.since + math.ceil((charge - live) / step(c)) * c.p
end

-- One window: config c, state st (the same table for the queue's), sliding log key.
local function roll(c, st)
  local window = math.floor(math.floor(NOW * 1e6 + 0.5) / math.max(1, math.floor(c.p * 1e6 + 0.5)))
  if window ~= st.w then
    st.w, st.n = window, 0
    DIRTY = true
  end
  return window
end

local function trim(c, st, log)
  local edge = '(' .. fmt(NOW - c.p)
  if not c.c then
    call('ZREMRANGEBYSCORE', log, '-inf', edge)
    return
  end
  local gone = call('ZRANGEBYSCORE', log, '-inf', edge)
  for _, m in ipairs(gone) do st.s = st.s - tonumber(sub(m, 15)) end
  if #gone > 0 then
    call('ZREMRANGEBYSCORE', log, '-inf', edge)
    st.dirty, DIRTY = true, true
  end
  if st.s ~= 0 and call('EXISTS', log) == 0 then
    st.s, st.dirty, DIRTY = 0, true, true
  end
end

local function total(c, st, log)
  if c.c then return st.s end
  return call('ZCARD', log)
end

local function interval(c) return c.p / limit_at(c) end

local function win_retry(c, st, log, charge)
  if c.a == 'gcra' then
    local allow_at = st.tat - interval(c) * (c.b - charge)
    if NOW >= allow_at then return nil end
    return allow_at
  end
  local window
  if c.a == 'fixed' then window = roll(c, st) else trim(c, st, log) end
  local limit = limit_at(c)
  if charge > limit then return raised_at(c, charge) end
  if c.a == 'fixed' then
    if st.n + charge <= limit then return nil end
    return (window + 1) * c.p
  end
  local sum = total(c, st, log)
  if sum + charge <= limit then return nil end
  if not c.c then  -- each entry counts 1: the (sum - limit)-th oldest must leave first
    local e = call('ZRANGE', log, sum - limit, sum - limit, 'WITHSCORES')
    return tonumber(e[2]) + c.p + EPSILON
  end
  local rest = sum
  local all = call('ZRANGE', log, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    rest = rest - tonumber(sub(all[i], 15))
    if rest + charge <= limit then return tonumber(all[i + 1]) + c.p + EPSILON end
  end
end

local function win_consume(c, st, log, charge)
  st.dirty, DIRTY = true, true
  if c.a == 'fixed' then
    local window = roll(c, st)
    st.n = st.n + charge
    return window
  elseif c.a == 'sliding' then
    trim(c, st, log)
    st.q = st.q + 1
    local member = string.format('%014x', st.q)
    if c.c then
      member = member .. fmt(charge)
      st.s = st.s + charge
    end
    call('ZADD', log, fmt(NOW), member)
    return st.q
  end
  st.tat = math.max(st.tat, NOW) + interval(c) * charge
  return 0
end

local function win_settle(c, st, log, token, charged, actual)
  st.dirty, DIRTY = true, true
  if c.a == 'fixed' then
    if roll(c, st) == token then st.n = math.max(0, st.n + (actual - charged)) end
  elseif c.a == 'sliding' then
    trim(c, st, log)
    local head = string.format('%014x', token)
    local all = call('ZRANGE', log, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
      if sub(all[i], 1, 14) == head then
        call('ZREM', log, all[i])
        call('ZADD', log, all[i + 1], head .. fmt(actual))
        st.s = math.max(0, st.s + (actual - tonumber(sub(all[i], 15))))
        break
      end
    end
  else
    st.tat = math.max(math.max(st.tat, NOW) + interval(c) * (actual - charged), NOW)
  end
end

local function win_used(c, st, log)
  if c.a == 'fixed' then
    roll(c, st)
    return st.n
  elseif c.a == 'sliding' then
    trim(c, st, log)
    return total(c, st, log)
  end
  return math.max(0, math.ceil((st.tat - NOW) / interval(c) - 1e-9))
end

local function rate_log(i) return BASE .. 'rate:' .. i end

-- -- a fairness key's windows -----------------------------------------------------------------
local function kw_key(key) return BASE .. 'kw:' .. S.kg .. ':' .. key end
local function kl_key(i, key) return BASE .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key end

local KEY_STATES = {}  -- the key states this call read, by key (a decision reads one twice)
local function key_state(key)
  local known = KEY_STATES[key]
  if known ~= nil and known.kg == S.kg then return known end
  local raw = call('HGETALL', kw_key(key))
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = tonumber(raw[i + 1]) end
  local ks = {key = key, b = h.b, win = {}, kg = S.kg}
  KEY_STATES[key] = ks
  for i = 1, #(S.kw or {}) do
    ks.win[i] = {w = h['w' .. i] or -1, n = h['n' .. i] or 0, tat = h['t' .. i] or 0,
                 q = h['q' .. i] or 0, s = h['s' .. i] or 0}
  end
  return ks
end

-- Write a key's windows back when they changed, and let them expire once empty.
local function key_save(ks)
  local dirty = ks.dirty
  for i = 1, #(S.kw or {}) do dirty = dirty or ks.win[i].dirty end
  if not dirty then return end
  local h, hk = {}, kw_key(ks.key)
  local fin = ks.b or -math.huge
  for i, c in ipairs(S.kw or {}) do
    local st = ks.win[i]
    local e
    if c.a == 'fixed' then
      h[#h + 1], h[#h + 2], h[#h + 3], h[#h + 4] = 'w' .. i, fmt(st.w), 'n' .. i, fmt(st.n)
      e = (st.w + 1) * c.p
    elseif c.a == 'gcra' then
      h[#h + 1], h[#h + 2] = 't' .. i, fmt(st.tat)
      e = st.tat
    else
      h[#h + 1], h[#h + 2], h[#h + 3], h[#h + 4] = 'q' .. i, fmt(st.q), 's' .. i, fmt(st.s)
      local last = call('ZRANGE', kl_key(i, ks.key), -1, -1, 'WITHSCORES')
      e = -math.huge
      if #last > 0 then e = tonumber(last[2]) + c.p end
    end
    if e > fin then fin = e end
  end
  if ks.b then h[#h + 1], h[#h + 2] = 'b', fmt(ks.b) end
  if #h > 0 then call('HSET', hk, unpack(h)) end
  call('ZADD', K.kidx, fmt(fin), S.kg .. ':' .. ks.key)
  local ttl = KEY_MARGIN_MS
  if fin > NOW then ttl = ttl + math.ceil((fin - NOW) * 1000) end
  call('PEXPIRE', hk, ttl)
  for i, c in ipairs(S.kw or {}) do
    if c.a == 'sliding' then call('PEXPIRE', kl_key(i, ks.key), ttl) end
  end
end

-- Delete the keys of member "<kg>:<key>" of kidx.
local function drop_key_state(member)
  local colon = string.find(member, ':', 1, true)
  local kg, key = sub(member, 1, colon - 1), sub(member, colon + 1)
  local doomed = {BASE .. 'kw:' .. kg .. ':' .. key}
  for i = 1, 8 do doomed[#doomed + 1] = BASE .. 'kl:' .. kg .. ':' .. i .. ':' .. key end
  call('DEL', unpack(doomed))
  call('ZREM', K.kidx, member)
  KEY_STATES[key] = nil
end

-- Forget keys whose windows are all empty and whose backoff is over (at most *limit*).
local function prune_keys(limit)
  local done = 0
  while not limit or done < limit do
    local e = call('ZRANGE', K.kidx, 0, 0, 'WITHSCORES')
    if #e == 0 or tonumber(e[2]) >= NOW then break end
    drop_key_state(e[1])
    done = done + 1
  end
  return done
end

-- -- deciding (Quota.check) -------------------------------------------------------------------
local function check_cost(cost)
  return S.cmax == nil or cost <= S.cmax
end

-- Quota.key_holds: true if key's own windows or backoff keep a ticket of *cost* out now, or
-- no window admits that cost any more (a waiter from before its limits were lowered).
local function key_holds(key, cost)
  if S.cmax ~= nil and cost > S.cmax then return true end
  if S.kw == nil and (S.kb == nil or S.kb <= NOW) then return false end
  local ks = key_state(key)
  local held = ks.b ~= nil and ks.b > NOW
  for i, c in ipairs(S.kw or {}) do
    if held then break end
    held = win_retry(c, ks.win[i], kl_key(i, key), charge_of(c, cost)) ~= nil
  end
  key_save(ks)
  return held
end

-- Quota._own: the period named (the rate line's) only while the key's own limits would let
-- the ticket in no later than the queue's windows.
-- A rate block carries pace and keyed (Block.pace, Block.keyed: the turns of a line).
local function own_block(t)
  local worst, period, bind, keyed = nil, nil, nil, false
  for i, w in ipairs(S.rw or {}) do
    local at = win_retry(w, w, rate_log(i), charge_of(w, t.cost))
    if at ~= nil and (worst == nil or at > worst) then worst, period, bind = at, w.p, w end
  end
  local limits = worst
  local ks = nil
  if S.kw ~= nil or (S.kb ~= nil and S.kb > NOW) then
    ks = key_state(t.key)
    for i, c in ipairs(S.kw or {}) do
      local at = win_retry(c, ks.win[i], kl_key(i, t.key), charge_of(c, t.cost))
      if at ~= nil and (limits == nil or at > limits) then limits, bind, keyed = at, c, true end
    end
    if ks.b ~= nil and ks.b > NOW then period = nil end
    key_save(ks)
  end
  if worst ~= nil and limits ~= nil and limits > worst then period = nil end
  local paused = nil
  if S.bo ~= nil and S.bo > NOW then paused = S.bo end
  if ks ~= nil and ks.b ~= nil and ks.b > NOW and (paused == nil or ks.b > paused) then
    paused = ks.b
  end
  if paused ~= nil and (limits == nil or paused >= limits) then
    return {at = paused, reason = 'backoff', period = period}
  end
  if limits == nil then return nil end
  return {at = limits, reason = 'rate', period = period, keyed = keyed, per_cost = bind.c,
          pace = bind.p / bind.l}
end

local function quota_check(t)
  local own = own_block(t)
  if (S.nr or 0) == 0 then return own end
  local h = call('ZRANGE', K.rline, 0, 0, 'WITHSCORES')
  local head, since = h[1], tonumber(h[2])
  if head == t.task then return own end
  local info = cmsgpack.unpack(call('HGET', K.rlined, head))
  -- Not starved yet, not back in time, or costing no less than the head (quota.py).
  if NOW < since + info[3] or NOW >= info[4] + GRANT_TTL or t.cost >= info[2] then return own end
  -- The head has waited a period: the windows are kept for it.
  local at = nil
  for i, w in ipairs(S.rw or {}) do
    local r = win_retry(w, w, rate_log(i), charge_of(w, info[2]))
    if r ~= nil and (at == nil or r > at) then at = r end
  end
  if at == nil then at = NOW + S.retry end
  if own ~= nil and own.at >= at then return own end
  return {at = at, reason = 'rate', period = info[3]}
end

local function unline(task)
  if call('HDEL', K.rlined, task) == 1 then
    call('ZREM', K.rline, task)
    set('nr', S.nr - 1)
  end
end

-- Waiter *task* was just denied by *block*: in the rate line while the queue's limits hold it.
local function blocked(task, since, cost, block)
  if block == nil or block.period == nil then
    unline(task)
    return
  end
  local old = call('HGET', K.rlined, task)
  if old then
    local a = cmsgpack.unpack(old)
    a[4] = block.at
    call('HSET', K.rlined, task, cmsgpack.pack(a))
  else
    call('ZADD', K.rline, fmt(since), task)
    call('HSET', K.rlined, task, cmsgpack.pack({since, cost, block.period, block.at}))
    set('nr', (S.nr or 0) + 1)
  end
end

-- Charge ticket t in every window; it leaves the rate line. The charge, for settle.
local function quota_consume(t)
  local toks, ktoks = {}, {}
  for i, w in ipairs(S.rw or {}) do
    toks[i] = win_consume(w, w, rate_log(i), charge_of(w, t.cost))
  end
  if S.kw ~= nil then
    local ks = key_state(t.key)
    for i, c in ipairs(S.kw or {}) do
      ktoks[i] = win_consume(c, ks.win[i], kl_key(i, t.key), charge_of(c, t.cost))
    end
    key_save(ks)
  end
  unline(t.task)
  return {cost = t.cost, t = toks, k = ktoks, e1 = S.rg, e2 = S.kg}
end

-- Correct charge ch to *actual* in every per-cost window; true if room was given back.
local function quota_settle(ch, key, actual)
  local cost_windows = false
  if ch.t ~= nil and ch.e1 == S.rg then
    for i, w in ipairs(S.rw or {}) do
      if w.c then
        win_settle(w, w, rate_log(i), ch.t[i], ch.cost, actual)
        cost_windows = true
      end
    end
  end
  if ch.k ~= nil and #ch.k > 0 and ch.e2 == S.kg and S.kw ~= nil then
    local ks = key_state(key)
    for i, c in ipairs(S.kw or {}) do
      if c.c then
        win_settle(c, ks.win[i], kl_key(i, key), ch.k[i], ch.cost, actual)
        cost_windows = true
      end
    end
    ks.dirty = true
    key_save(ks)
  end
  ch.st = true
  return cost_windows and actual < ch.cost
end

local function quota_backoff(seconds, key)
  local untl = NOW + seconds
  if key == nil then
    if S.bo == nil or S.bo <= NOW then
      for _, w in ipairs(S.rw or {}) do
        if w.ad then
          w.live = math.max(1, math.floor(limit_at(w) / 2))
          w.since = NOW
          DIRTY = true
        end
      end
    end
    if S.bo == nil or untl > S.bo then set('bo', untl) end
    return S.bo
  end
  local ks = key_state(key)
  if ks.b == nil or untl > ks.b then ks.b = untl end
  if S.kb == nil or ks.b > S.kb then set('kb', ks.b) end  -- a key's backoff is in force
  ks.dirty = true
  key_save(ks)
  return ks.b
end

-- The queue's first window's use (QueueStats.rate_used), then every window's {use, live}.
local function quota_uses()
  local out = {}
  for i, w in ipairs(S.rw or {}) do
    local used = win_used(w, w, rate_log(i))
    local live = ''
    if w.ad then live = fmt(limit_at(w)) end
    out[i] = {fmt(used), live}
  end
  return out
end
