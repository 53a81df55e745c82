-- prelude.lua: what every script needs first; the start of each one.
--
-- RedisBackend assembles each operation script as prelude.lua + <method>.lua, with
-- queue_state.lua (the full rules) inserted where <method>.lua has a line "--@queue_state"
-- (or before it, when it has none). Each EVALSHA is one atomic decision. Together these
-- files mirror celery_flowcontrol/admission/queue_state.py (QueueState) and rate.py step for
-- step; the stateful hypothesis test holds them to identical decisions.
--
-- Why the split: Lua creates a closure for every "local function" each time a script runs,
-- about 0.15 us apiece. The hot paths (admit and release when no waiter exists and nothing
-- is due) return before queue_state.lua's definitions run, using only what is here.
--
-- KEYS[1]  <prefix>:{<queue>}:cfg, the queue's config hash. Every other key of the queue is
--          derived from it, so all of them share the hash tag {<queue>} (one cluster slot):
--            cfg       hash   config fields, overrides, counters, rate window state
--            leases    zset   instance -> lease expiry
--            held:<i>  set    slot ids held by instance <i>
--            slots     hash   slot id -> msgpack {holder, task, key, label, acquired, expires|false}
--            tasks     hash   task id -> slot id it holds
--            holds     zset   slot id -> max_hold expiry
--            keycount  hash   fairness key -> slots + grants of that key
--            grants    hash   task id -> msgpack {slot id, granted, expires, hold|false, waiter...}
--            gexp      zset   task id -> grant expiry
--            waiting   hash   task id -> msgpack {priority, key, label, seq, instance, since, expires}
--            wexp      zset   task id -> waiter expiry
--            line:<g>  zset   one line per group key <g>: score -priority, member ORD .. task id
--            ring      zset   the lines by their head: score -priority, member VT .. ORD .. <g>
--            ringent   hash   group key -> its ring member
--            vtime     hash   group key -> virtual time (fairness="key")
--            rate      zset   sliding window log: score admission time, member a counter
-- ARGV[1..3] instance_ttl, grant_ttl, waiter_ttl (float seconds, as Python repr)
-- ARGV[4]  the grants channel; a grant PUBLISHes a JSON array
--          [queue, task id, slot id, granted_at, expires_at] (times as %.17g strings)
-- ARGV[5]  now in integer milliseconds, or "" to read Redis TIME (one clock per decision)
-- ARGV[6..] the operation's own arguments
-- (The constant arguments come first, so a caller can send them pre-encoded.)
--
-- Encodings. Times are float seconds (IEEE doubles, now = ms / 1000), computed with the same
-- operations as the Python reference and written with %.17g, so every instant is the exact
-- double the reference computes. Sorted lines use the score for -priority (-1e6..1e6) and
-- fixed-width lowercase hex in the member for the rest, so ties sort by member bytes:
--   ORD = %011x of (+seq for fifo, -seq for lifo) + 2^40   (seq < 2^40)
--   VT  = %014x of the line's virtual time                   (< 2^53)
-- Returns of a missing queue: the integer -1 (UNKNOWN), turned into UnknownQueueError.

local UNKNOWN = -1
local GRANT_BATCH = 256    -- admission/base.py
local KEY_SCAN = 64        -- admission/base.py
local MAX_BACKOFF = 30     -- admission/queue_state.py
local EPSILON = 0.001      -- admission/rate.py
local OFF = 1099511627776  -- 2^40

local BASE = string.sub(KEYS[1], 1, -4)
-- K.<part> is BASE .. <part>, built on first use (a hot path touches half of them).
local K = setmetatable({cfg = KEYS[1]}, {__index = function(k, part)
  local key = BASE .. part
  rawset(k, part, key)
  return key
end})

-- Now, in float seconds; set by load() (read Redis TIME only on paths that need a time).
local NOW
local INSTANCE_TTL = tonumber(ARGV[1])
local GRANT_TTL = tonumber(ARGV[2])
local WAITER_TTL = tonumber(ARGV[3])
local CHANNEL = ARGV[4]

local call = redis.call
local sub = string.sub

local function fmt(x) return string.format('%.17g', x) end

local function held_key(instance) return BASE .. 'held:' .. instance end

-- The queue's config and counters (S), loaded once per call; changed counters are saved.
-- S: the queue's config (name, cap, pkc, retry, fair, order, hold, ra, rl, rp, rb, rel), its
-- overrides (co, ho) and state (seq, sseq, vclock, rseq, fw, fc, tat, nd), kept as one
-- msgpack map in the cfg hash's field "S" (absent keys are None): one HGET and one C-side
-- unpack per call. The config JSON for get_config sits beside it in field "json".
local S, DIRTY = {}, false

local function opt(x)
  if x == '' then return nil end
  return x
end

local function load()
  local blob = call('HGET', K.cfg, 'S')
  if not blob then return false end
  S = cmsgpack.unpack(blob)
  if ARGV[5] == '' then
    local t = call('TIME')
    NOW = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) / 1000
  else
    NOW = tonumber(ARGV[5]) / 1000
  end
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

local function sunpack(id, s)
  local a = cmsgpack.unpack(s)
  return {id = id, holder = a[1], task = a[2], key = a[3], label = a[4], acquired = a[5],
          exp = a[6] or nil}
end

local function spack(sl)
  return cmsgpack.pack({sl.holder, sl.task, sl.key, sl.label, sl.acquired, sl.exp or false})
end

-- Flat reply forms (Redis truncates Lua numbers to integers: times go as strings).
local function slot_reply(sl)
  return {sl.id, sl.holder, sl.task, sl.key, sl.label, fmt(sl.acquired),
          sl.exp and fmt(sl.exp) or ''}
end

local function admitted(sl) return {1, unpack(slot_reply(sl))} end

local function capacity()
  if S.co ~= nil then return S.co end
  return S.cap
end

local function max_hold()
  if S.ho ~= nil then return S.ho end
  return S.hold
end

local function free()
  local cap = capacity()
  if cap == nil then return math.huge end
  return cap - call('HLEN', K.slots) - call('HLEN', K.grants)
end

local function fixed_roll()
  local window = math.floor(NOW / S.rp)
  if window ~= S.fw then
    set('fw', window)
    set('fc', 0)
  end
  return window
end

local function sliding_trim()
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

local function uncount(key)
  if call('HINCRBY', K.keycount, key, -1) <= 0 then call('HDEL', K.keycount, key) end
end

local function new_slot_id()
  set('sseq', S.sseq + 1)
  return S.name .. ':' .. string.format('%d', S.sseq)
end

local function hold_until()
  local hold = max_hold()
  if hold == nil then return nil end
  return NOW + hold
end

local function add_slot(sl)
  call('HSET', K.slots, sl.id, spack(sl))
  call('HSET', K.tasks, sl.task, sl.id)
  if sl.exp then
    call('ZADD', K.holds, fmt(sl.exp), sl.id)
    due_by(sl.exp)
  end
  call('SADD', held_key(sl.holder), sl.id)
end

local function drop_slot(id)
  local s = call('HGET', K.slots, id)
  if not s then return nil end
  local sl = sunpack(id, s)
  call('HDEL', K.slots, id)
  -- QueueState checks slot_of_task[task] == id first; a task holds one slot at most (admit
  -- re-holds a held task's slot, and a waiter or grantee holds none), so it always does.
  call('HDEL', K.tasks, sl.task)
  if sl.exp then call('ZREM', K.holds, id) end
  uncount(sl.key)
  call('SREM', held_key(sl.holder), id)
  return sl
end

local function lease(instance)
  local at = NOW + INSTANCE_TTL
  call('ZADD', K.leases, fmt(at), instance)
  due_by(at)
end

-- The first member of zset *key* if its score is due (<= NOW).
local function due(key)
  local e = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #e > 0 and tonumber(e[2]) <= NOW then return e[1] end
  return nil
end

local function saturated(key)
  if S.pkc == nil then return false end
  return (tonumber(call('HGET', K.keycount, key)) or 0) >= S.pkc
end
