-- prelude.lua: the queue's config and counters, rate window, leases and expiry bounds.
-- Follows keys.lua (layout, KEYS, ARGV and encodings are described there).

-- S: the queue's config (name, cap, pkc, retry, fair, order, hold, ra, rl, rp, rb, rel), its
-- overrides (co, ho) and state (seq, sseq, vclock, rseq, fw, fc, tat, nd, nw, ng), kept as
-- one msgpack map in the cfg hash's field "S" (absent keys are None): one HGET and one C-side
-- unpack per call. The config JSON for get_config sits beside it in field "json".
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

local function load()
  local blob = call('HGET', K.cfg, 'S')
  if not blob then return false end
  S = cmsgpack.unpack(blob)
  if S.nw == nil then
    S.nw, S.ng, DIRTY = call('HLEN', K.waiting), call('HLEN', K.grants), true
  end
  clock()
  return true
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
                        sl.uncounted})
end



local function capacity()
  if S.co ~= nil then return S.co end
  return S.cap
end

local function max_hold()
  if S.ho ~= nil then return S.ho end
  return S.hold
end


local function fixed_roll()
  -- In whole microseconds, as rate.fixed_window: NOW / S.rp in floats puts an instant on a
  -- boundary in the window before it (4.3 / 0.1 == 42.99999999999999).
  local window = math.floor(math.floor(NOW * 1e6 + 0.5) / math.max(1, math.floor(S.rp * 1e6 + 0.5)))
  if window ~= S.fw then
    set('fw', window)
    set('fc', 0)
  end
  return window
end

local trimmed  -- the instant the log was last trimmed at (once per decision is enough)
local function sliding_trim()
  if trimmed == NOW then return end
  trimmed = NOW
  call('ZREMRANGEBYSCORE', K.rate, '-inf', '(' .. fmt(NOW - S.rp))
end

local function gcra_interval() return S.rp / S.rl end

local function rate_retry_at()
  if S.ra == 'fixed' then
    local window = fixed_roll()
    if S.fc < S.rl then return nil end
    return (window + 1) * S.rp
  elseif S.ra == 'sliding' then
    sliding_trim()
    if call('ZCARD', K.rate) < S.rl then return nil end
    local t = call('ZRANGE', K.rate, -S.rl, -S.rl, 'WITHSCORES')
    return tonumber(t[2]) + S.rp + EPSILON
  end
  local interval = gcra_interval()
  local allow_at = S.tat - interval * (S.rb - 1)
  if NOW >= allow_at then return nil end
  return allow_at
end

local function rate_consume()
  if S.ra == 'fixed' then
    fixed_roll()
    set('fc', S.fc + 1)
  elseif S.ra == 'sliding' then
    sliding_trim()
    set('rseq', S.rseq + 1)
    call('ZADD', K.rate, fmt(NOW), string.format('%014x', S.rseq))
  else
    set('tat', math.max(S.tat, NOW) + gcra_interval())
  end
end

local function take_rate()
  if S.ra == nil then return true end
  if rate_retry_at() ~= nil then return false end
  rate_consume()
  return true
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
