-- keys.lua: the start of every script: key layout, arguments, encodings, the slot store.
--
-- scripts.py assembles each operation script as keys.lua + <method>.lua, where a line
-- "--@prelude" in <method>.lua becomes prelude.lua (config and counters, leases, expiry
-- bounds), "--@quota" quota.lua (rate limits, per-key windows, backoffs, the rate line) and
-- "--@queue_state" queue_state.lua (lines, grants, the full decision); a method file with
-- none of them gets all three at its top. A line "--@keys"
-- places this file there instead of first. Each EVALSHA is one atomic decision. Together
-- these files mirror admission/queue_state.py (with busy.py and lines.py) and rate.py step
-- for step; the stateful hypothesis test holds them to identical decisions.
--
-- Why the split: Lua creates a closure for every "local function" each time a script runs
-- (a cost that grows with their number, more on a cold cache), so the hot paths run before
-- the definitions they do not need: admit's fast path (no waiter, nothing due, a free slot)
-- and release's (no waiter to grant to) come before even this file, written out inline, and
-- fall through to the full rules only when they can't decide alone.
--
-- KEYS[1]  <prefix>:{<queue>}:cfg, the queue's config hash. Every other key of the queue is
--          derived from it, so all of them share the hash tag {<queue>} (one cluster slot):
--            cfg       hash   config fields, overrides, counters, rate window state
--            leases    zset   instance -> lease expiry
--            held:<i>  set    slot ids held by instance <i>
--            slots     hash   slot id -> msgpack {holder, task, key, label, acquired, expires|false,
--                             true if not in keycount (else false or absent), the admission's
--                             charge (quota.lua's quota_consume) or false/absent where it
--                             charged cost 1 per call only}, and ":" .. task id -> the
--                             slot id that task holds (slot ids never start with ":"; one hash,
--                             so one write sets or drops both)
--            holds     zset   slot id -> max_hold expiry
--            keycount  hash   fairness key -> slots + grants of that key. Read only under a
--                             per-key cap, so admit's fast path leaves a slot out of it while
--                             the queue has none (and marks the slot so); register.lua counts
--                             such slots when a cap comes
--            grants    hash   task id -> msgpack {slot id, granted, expires, hold|false, waiter...}
--            gexp      zset   task id -> grant expiry
--            waiting   hash   task id -> msgpack {priority, key, label, seq, instance, since, expires}
--            wexp      zset   task id -> waiter expiry
--            line:<g>  zset   one line per group key <g>: score -priority, member ORD .. task id
--            ring      zset   the lines by their head: score -priority, member VT .. ORD .. <g>
--            ringent   hash   group key -> its ring member
--            vtime     hash   group key -> virtual time (fairness="key")
--            rate:<i>  zset   sliding window log of the queue's limit i (quota.lua)
--            kw:, kl:, kidx, rline, rlined: a key's windows, the rate line (quota.lua)
-- ARGV[1..3] instance_ttl, grant_ttl, waiter_ttl (float seconds, as Python repr)
-- ARGV[4]  the grants channel; a grant PUBLISHes a JSON array
--          [queue, task id, slot id, granted_at, expires_at, waiter's instance]
--          (times as %.17g strings)
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
local TURN_SAMPLE = 8      -- admission/lines.py
local TURN_EARLY = 0.9    -- admission/quota.py
local EPSILON = 0.001      -- admission/rate.py
local OFF = 1099511627776  -- 2^40

local BASE = string.sub(KEYS[1], 1, -4)
-- K.<part> is BASE .. <part>, built on first use (a hot path touches half of them).
local K = setmetatable({cfg = KEYS[1]}, {__index = function(k, part)
  local key = BASE .. part
  rawset(k, part, key)
  return key
end})

-- Now, in float seconds; set by clock() in prelude.lua, which load() calls (Redis TIME is
-- read only when needed).
local NOW
local INSTANCE_TTL = tonumber(ARGV[1])
local GRANT_TTL = tonumber(ARGV[2])
local WAITER_TTL = tonumber(ARGV[3])
local CHANNEL = ARGV[4]

local call = redis.call
local sub = string.sub

local function fmt(x) return string.format('%.17g', x) end

local function held_key(instance) return BASE .. 'held:' .. instance end

local function sunpack(id, s)
  local a = cmsgpack.unpack(s)
  return {id = id, holder = a[1], task = a[2], key = a[3], label = a[4], acquired = a[5],
          exp = a[6] or nil, uncounted = a[7] or nil, charge = a[8] or nil}
end

local function uncount(key)
  if call('HINCRBY', K.keycount, key, -1) <= 0 then call('HDEL', K.keycount, key) end
end

local function drop_slot(id)
  local s = call('HGET', K.slots, id)
  if not s then return nil end
  local sl = sunpack(id, s)
  -- BusySlots checks of_task[task] == id first; a task holds one slot at most (admit
  -- readmits a busy task's slot, and a waiter or grantee holds none), so it always does.
  call('HDEL', K.slots, id, ':' .. sl.task)
  if sl.exp then call('ZREM', K.holds, id) end
  if not sl.uncounted then uncount(sl.key) end
  call('SREM', held_key(sl.holder), id)
  return sl
end
