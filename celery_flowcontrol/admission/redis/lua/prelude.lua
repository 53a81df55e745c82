-- prelude.lua: the queue's config and counters, rate window, leases and expiry bounds.
-- Follows keys.lua (layout, KEYS, ARGV and encodings are described there).

-- S: the queue's config (name, cap, pkc, retry, fair, order, hold, rel, and the rate limits:
-- rw, kw, cmax, fx, rsig, ksig, see quota.lua), its overrides (co, ho) and state (seq, sseq,
-- vclock, nd, nw, ng; the windows' own in rw, rg, kg, bo, nr), kept as one msgpack map in the
-- cfg hash's field "S" (absent keys are None): one HGET and one C-side unpack per call. The config JSON for get_config sits beside it in field "json".
-- S.nw and S.ng count the waiters and the grants (enqueue, dequeue_w, grant and drop_grant
-- keep them), so admit's fast path learns "nobody waits, nothing is granted" from S alone;
-- a state without them (written before they were kept) gets them on its next load.
local S, DIRTY = {}, false

local function opt(x)
  if x == '' then return nil end
  return x
end

-- Sets NOW: ARGV[5] in whole milliseconds, or Redis TIME when it is "" (keys.lua), in the
-- same millisecond steps either way. The one clock read of every script but admit's fast path.
local function clock()
  if ARGV[5] == '' then
    local t = call('TIME')
    NOW = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) / 1000
  else
    NOW = tonumber(ARGV[5]) / 1000
  end
end

local function set(field, value)
  S[field] = value
  DIRTY = true
end

local function save()
  if DIRTY then call('HSET', K.cfg, 'S', cmsgpack.pack(S)) end
  DIRTY = false
end

-- S.nd ("next due") is a lower bound of every expiry in leases, holds, gexp and wexp: each
-- expiry written lowers it, removals leave it, and a look that finds nothing due raises it
-- to the true minimum. Before it, nothing can be due, which spares a decision four reads.
local function due_by(at)
  if S.nd == nil or at < S.nd then set('nd', at) end
end

local function nothing_due()
  if S.nd ~= nil and NOW < S.nd then return true end
  local first = math.huge
  for _, key in ipairs({K.leases, K.holds, K.gexp, K.wexp}) do
    local e = call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if #e > 0 then
      local at = tonumber(e[2])
      if at <= NOW then return false end
      if at < first then first = at end
    end
  end
  set('nd', first)
  return true
end


local function spack(sl)
  return cmsgpack.pack({sl.holder, sl.task, sl.key, sl.label, sl.acquired, sl.exp or false,
                        sl.uncounted or false, sl.charge or false})
end

-- The rate limits of a config (QueueConfig.to_dict's rate_limit or per_key_rate_limit: null,
-- one dict, or a list of them) as window configs {a, l, p, b, c, ad} (quota.lua), and a
-- signature that changes when any of them does.
local function rate_config(r, sig)
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

-- Take the rate limits of config JSON *json* (or the operator's override, S.rover) into S:
-- windows restart only where the limits changed (a new epoch, so a charge made in the old ones is past), as Quota.configure.
local function configure_rates(json)
  local conf = cjson.decode(json)
  local limits = conf.rate_limit
  if S.rover ~= nil then limits = cjson.decode(S.rover) end  -- the operator's, until reset
  local rw, rsig = rate_config(limits)
  local kw, ksig = rate_config(conf.per_key_rate_limit)
  if S.rsig ~= rsig then
    for i = 1, 8 do call('DEL', BASE .. 'rate:' .. i) end
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
    set('kg', (S.kg or 0) + 1)  -- a new namespace: the old keys go (quota.lua's kidx)
  end
  -- admit.lua's fast path takes no adaptive limit, and no per-cost sliding log per key (its
  -- trim would have a sum to write back even when the admission fails).
  local most, fx = nil, true
  for _, w in ipairs(rw or {}) do
    if w.ad then fx = false end
  end
  for _, w in ipairs(kw or {}) do
    if w.a == 'sliding' and w.c then fx = false end
  end
  for _, list in ipairs({rw or {}, kw or {}}) do
    for _, w in ipairs(list) do
      local cap = w.l
      if w.a == 'gcra' then cap = w.b end
      if w.c and (most == nil or cap < most) then most = cap end
    end
  end
  set('cmax', most)
  set('fx', fx)
  for _, f in ipairs({'ra', 'rl', 'rp', 'rb', 'fw', 'fc', 'tat', 'rseq'}) do set(f, nil) end
  if S.nr == nil then set('nr', 0) end
end



local function load()
  local blob = call('HGET', K.cfg, 'S')
  if not blob then return false end
  S = cmsgpack.unpack(blob)
  if S.nw == nil then
    S.nw, S.ng, DIRTY = call('HLEN', K.waiting), call('HLEN', K.grants), true
  end
  clock()
  if S.fx == nil then  -- a state written before quotas: its rate limit, from its config
    DIRTY = true
    configure_rates(call('HGET', K.cfg, 'json'))
  end
  return true
end

local function capacity()
  if S.co ~= nil then return S.co end
  return S.cap
end

local function max_hold()
  if S.ho ~= nil then return S.ho end
  return S.hold
end


local function count(key) call('HINCRBY', K.keycount, key, 1) end


local function new_slot_id()
  set('sseq', S.sseq + 1)
  return S.name .. ':' .. string.format('%d', S.sseq)
end

local function max_hold_until()
  local hold = max_hold()
  if hold == nil then return nil end
  return NOW + hold
end

local function add_slot(sl)
  call('HSET', K.slots, sl.id, spack(sl), ':' .. sl.task, sl.id)
  if sl.exp then
    call('ZADD', K.holds, fmt(sl.exp), sl.id)
    due_by(sl.exp)
  end
  call('SADD', held_key(sl.holder), sl.id)
end


local function lease(instance)
  local at = NOW + INSTANCE_TTL
  call('ZADD', K.leases, fmt(at), instance)
  due_by(at)
end


local function saturated(key)
  if S.pkc == nil then return false end
  return (tonumber(call('HGET', K.keycount, key)) or 0) >= S.pkc
end
