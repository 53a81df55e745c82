-- quota.lua: every rate limit of a queue, its fairness keys' windows, backoffs and the rate
-- line (admission/quota.py, the reference). Needs keys.lua, state.lua, windows.lua and
-- key_windows.lua.
--
-- Layout (besides keys.lua's):
--   S.rw      the queue's windows, in rate_limit order (windows.lua: config and state in one
--             table); S.kw the per-key limits {a, l, p, b, c}; S.rg, S.kg their epochs (a
--             charge made under another epoch is past); S.cmax the largest cost a ticket may
--             have; S.bo the queue's backoff end, S.kb the last end of any key's (a key's own
--             windows are read only while one may be in force, or under per-key limits);
--             S.nr the rate line's length.
--   rate:<i>  zset  the queue's sliding window i (windows.lua)
--   kw:, kl:  a fairness key's windows (key_windows.lua)
--   kidx      zset  "<kg>:<key>" -> when that key's windows are empty again: each decision's
--                   lazy expiry deletes a few that are (Quota.prune), reclaim all of them,
--                   unregister every one; and each key's own redis keys expire
--                   C_KEY_MARGIN_MS after that instant as well, so memory stays bounded
--                   whatever the number of keys (their meaning never depends on the TTL: the
--                   windows' arithmetic does).
--   rline     zset  the rate line: score since, member task id
--   rlined    hash  task id -> msgpack {since, cost, period, retry_at of its last denial}

-- The rate limits of a config (QueueConfig.to_dict's rate_limit or per_key_rate_limit: null,
-- one dict, or a list of them) as window configs, and a signature that changes when any of
-- them does.
local function rate_config(r)
  if type(r) ~= 'table' then return nil, '' end
  if r[1] == nil then r = {r} end
  local out, parts = {}, {}
  for i, d in ipairs(r) do
    local w = {a = d.algorithm, l = d.limit, p = d.period, b = d.burst}
    if d.per == 'cost' then w.c = true end
    if d.adaptive == true then w.ad = true end
    out[i] = w
    parts[i] = w.a .. ',' .. fmt(w.l) .. ',' .. fmt(w.p) .. ',' .. fmt(w.b) .. ',' .. d.per
               .. ',' .. tostring(d.adaptive)
  end
  return out, table.concat(parts, ';')
end

-- The largest cost windows *list* admit at once (per-cost ones only), and *most* if less.
local function cost_cap(list, most)
  for _, w in ipairs(list or {}) do
    local cap = w.l
    if w.a == 'gcra' then cap = w.b end
    if w.c and (most == nil or cap < most) then most = cap end
  end
  return most
end

-- Take the rate limits of config JSON *json* (or the operator's override, S.rover) into S:
-- windows restart only where the limits changed (a new epoch, so a charge made in the old
-- ones is past), as Quota.configure.
local function configure_rates(json)
  local conf = cjson.decode(json)
  local limits = conf.rate_limit
  if S.rover ~= nil then limits = cjson.decode(S.rover) end  -- the operator's, until reset
  local rw, rsig = rate_config(limits)
  local kw, ksig = rate_config(conf.per_key_rate_limit)
  if S.rsig ~= rsig then
    for i = 1, C_MAX_RATE_LIMITS do call('DEL', rate_rkey(i)) end
    for _, w in ipairs(rw or {}) do
      w.live, w.w, w.n, w.tat, w.q, w.s = w.l, -1, 0, 0, 0, 0
    end
    set('rw', rw)
    set('rsig', rsig)
    set('rg', (S.rg or 0) + 1)
  end
  if S.ksig ~= ksig or S.kg == nil then
    set('kw', kw)
    set('ksig', ksig)
    set('kg', (S.kg or 0) + 1)  -- a new namespace: the old keys go (kidx)
    call('DEL', K.kbo)  -- and their backoffs with them
  end
  set('qcmax', cost_cap(rw, nil))
  set('cmax', cost_cap(kw, S.qcmax))
  if S.nr == nil then set('nr', 0) end
end

-- Forget keys whose windows are all empty and whose backoff is over (at most *limit*).
local function prune_keys(limit)
  local done = 0
  while not limit or done < limit do
    local e = call('ZRANGE', K.kidx, 0, 0, 'WITHSCORES')
    if #e == 0 or tonumber(e[2]) >= NOW then break end
    local rkeys, key = key_state_rkeys(e[1])
    call('DEL', unpack(rkeys))
    call('ZREM', K.kidx, e[1])
    KEY_STATES[key] = nil
    done = done + 1
  end
  return done
end

-- -- deciding (Quota.check) -------------------------------------------------------------------
local function check_cost(key, cost)
  local most = key_rules(key).cmax
  return most == nil or cost <= most
end

-- Quota.key_holds: true if key's own windows or backoff keep a ticket of *cost* out now, or
-- no window admits that cost any more (a waiter from before its limits were lowered).
local function key_holds(key, cost)
  local rules = key_rules(key)
  if rules.cmax ~= nil and cost > rules.cmax then return true end
  if rules.kw == nil and (S.kb == nil or S.kb <= NOW) then return false end
  local ks = key_state(key)
  local held = ks.b ~= nil and ks.b > NOW
  for i, c in ipairs(rules.kw or {}) do
    if held then break end
    held = win('retry', c, ks.win[i], kl_rkey(i, key), cost) ~= nil
  end
  key_save(ks)
  return held
end

-- Block.turn: a sliding per-call log frees room where its entries leave the span (the
-- ceiling counts; a limit back, a period later); elsewhere one pace per waiter ahead, early.
local function block_turn(b, ahead, mean)
  if b.log == nil then return b.at + C_TURN_EARLY * ahead * b.pace * (b.per_cost and mean or 1) end
  local c, at = b.bind, b.at
  local i = call('ZCARD', b.log) - c.l + ahead % c.l  -- trimmed by 'retry' at this NOW
  if i >= 0 then at = math.max(at, win('leaves', c, nil, b.log, i)) end
  return at + math.floor(ahead / c.l) * (c.p + C_EPSILON)
end

-- Quota._own: the period named (the rate line's) only while the key's own limits would let
-- the ticket in no later than the queue's windows.
-- A rate block carries pace, keyed and its turn (Block.pace, Block.keyed, Block.turn).
local function own_block(t)
  local worst, period, bind, keyed, bi = nil, nil, nil, false, nil
  for i, w in ipairs(S.rw or {}) do
    local at = win('retry', w, w, rate_rkey(i), t.cost)
    if at ~= nil and (worst == nil or at > worst) then worst, period, bind, bi = at, w.p, w, i end
  end
  local limits = worst
  local ks = nil
  local kw = key_rules(t.key).kw
  if kw ~= nil or (S.kb ~= nil and S.kb > NOW) then
    ks = key_state(t.key)
    for i, c in ipairs(kw or {}) do
      local at = win('retry', c, ks.win[i], kl_rkey(i, t.key), t.cost)
      if at ~= nil and (limits == nil or at > limits) then limits, bind, keyed, bi = at, c, true, i end
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
    return {at = paused, reason = C_BACKOFF, period = period}
  end
  if limits == nil then return nil end
  local log = nil  -- a sliding per-call log's turns follow its entries
  if bind.a == 'sliding' and not bind.c then log = keyed and kl_rkey(bi, t.key) or rate_rkey(bi) end
  return {at = limits, reason = keyed and C_KEY_RATE or C_RATE, period = period, keyed = keyed,
          per_cost = bind.c, pace = bind.p / bind.l, turn = block_turn, bind = bind, log = log}
end

-- nil if ticket t passes every limit and backoff now, else its block {at, reason, period...}.
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
    local r = win('retry', w, w, rate_rkey(i), info[2])
    if r ~= nil and (at == nil or r > at) then at = r end
  end
  if at == nil then at = NOW + S.retry end
  if own ~= nil and own.at >= at then return own end
  return {at = at, reason = C_RATE, period = info[3]}
end

local function unline(task)
  if (S.nr or 0) > 0 and call('HDEL', K.rlined, task) == 1 then
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
    toks[i] = win('consume', w, w, rate_rkey(i), t.cost)
  end
  local rules = key_rules(t.key)
  if rules.kw ~= nil then
    local ks = key_state(t.key)
    for i, c in ipairs(rules.kw) do
      ktoks[i] = win('consume', c, ks.win[i], kl_rkey(i, t.key), t.cost)
    end
    key_save(ks)
  end
  unline(t.task)
  return {cost = t.cost, t = toks, k = ktoks, e1 = S.rg, e2 = S.kg, ks = rules.ksig}
end

-- Correct charge ch to *actual* in every per-cost window; true if room was given back.
local function quota_settle(ch, key, actual)
  local cost_windows = false
  if ch.t ~= nil and ch.e1 == S.rg then
    for i, w in ipairs(S.rw or {}) do
      if w.c then
        win('settle', w, w, rate_rkey(i), ch.t[i], ch.cost, actual)
        cost_windows = true
      end
    end
  end
  local rules = key_rules(key)
  if ch.k ~= nil and #ch.k > 0 and ch.e2 == S.kg and rules.kw ~= nil
      and (ch.ks or S.ksig or '') == rules.ksig then
    local ks = key_state(key)
    for i, c in ipairs(rules.kw) do
      if c.c then
        win('settle', c, ks.win[i], kl_rkey(i, key), ch.k[i], ch.cost, actual)
        cost_windows = true
      end
    end
    ks.dirty = true
    key_save(ks)
  end
  ch.st = true
  return cost_windows and actual < ch.cost
end

-- Pause the queue (key nil) or one fairness key for *seconds*; the end in force.
local function quota_backoff(seconds, key)
  local untl = NOW + seconds
  if key == nil then
    if S.bo == nil or S.bo <= NOW then
      for _, w in ipairs(S.rw or {}) do
        if w.ad then
          w.live = math.max(1, math.floor(win('limit', w) / 2))
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
  -- kbo: the keys' backoffs, for key_stats; those over are dropped as others come.
  local over = call('ZRANGEBYSCORE', K.kbo, '-inf', fmt(NOW), 'LIMIT', 0, 100)
  if #over > 0 then call('ZREM', K.kbo, unpack(over)) end
  call('ZADD', K.kbo, fmt(ks.b), key)
  ks.dirty = true
  key_save(ks)
  return ks.b
end

-- Every window's {use, live} (the first's use is QueueStats.rate_used).
local function quota_uses()
  local out = {}
  for i, w in ipairs(S.rw or {}) do
    local used = win('used', w, w, rate_rkey(i))
    local live = ''
    if w.ad then live = fmt(win('limit', w)) end
    out[i] = {fmt(used), live}
  end
  return out
end
