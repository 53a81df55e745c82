-- state.lua: the queue's state record S, the clock, and what QueueState reads of its config
-- (capacity, max_hold, free, the slot sequence). Needs keys.lua.
--
-- S: the queue's config (name, cap, pkc, retry, fair, order, hold, rel, and the rate limits: rw,
-- kw, cmax, fx, rsig, ksig, see quota.lua), its overrides (co, ho, rover) and counters (seq,
-- vclock, nd, nw, ng, ann; the windows' own in rw, rg, kg, bo, kb, nr), kept as one msgpack map in
-- the cfg hash's field "S" (absent keys are nil): one HGET and one C-side unpack per call. The slot
-- sequence is the field "sseq" beside it (HINCRBY), so an admission changing nothing else need not
-- write S back. The config JSON for get_config is in field "json". S.nw and S.ng count the waiters
-- and the grants (lines.lua and grants.lua keep them), so admit's fast path learns "nobody waits,
-- nothing is granted" from S alone. (S and DIRTY are declared in keys.lua.)

-- The common arguments (keys.lua): admit's fast path, before this, parses only the one it uses.
local INSTANCE_TTL = tonumber(ARGV[1])
local GRANT_TTL = tonumber(ARGV[2])
local WAITER_TTL = tonumber(ARGV[3])
local CHANNEL = ARGV[4]

-- Sets NOW and NOW_MS: ARGV[5] in whole milliseconds, or Redis TIME when it is "" (keys.lua), in
-- the same millisecond steps either way. The one clock read of every script.
local function clock()
  if ARGV[5] == '' then
    local t = call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    NOW, NOW_MS = ms / 1000, string.format('%d', ms)
  else
    NOW, NOW_MS = tonumber(ARGV[5]) / 1000, ARGV[5]
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

-- The config fields of S from the arguments codec.config_args sends, ARGV[i] the config JSON.
local function config_of(i)
  return {name = ARGV[i + 1], cap = tonumber(ARGV[i + 2]), pkc = tonumber(ARGV[i + 3]),
          retry = tonumber(ARGV[i + 4]), fair = ARGV[i + 5], order = ARGV[i + 6],
          hold = tonumber(ARGV[i + 7]), rel = ARGV[i + 8]}
end

-- S, and NOW; false if the queue does not exist.
local function load()
  local blob = call('HGET', K.cfg, 'S')
  if not blob then return false end
  S = cmsgpack.unpack(blob)
  clock()
  return true
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
  for _, rkey in ipairs({K.leases, K.holds, K.gexp, K.wexp}) do
    local e = call('ZRANGE', rkey, 0, 0, 'WITHSCORES')
    if #e > 0 then
      local at = tonumber(e[2])
      if at <= NOW then return false end
      if at < first then first = at end
    end
  end
  set('nd', first)
  return true
end

-- The capacity in force: the operator's override, else the configured concurrency.
local function capacity()
  if S.co ~= nil then return S.co end
  return S.cap
end

local function max_hold()
  if S.ho ~= nil then return S.ho end
  return S.hold
end

local function max_hold_until()
  local hold = max_hold()
  if hold == nil then return nil end
  return NOW + hold
end

-- Slots free for admissions: the capacity less the busy slots and the grants.
local function free()
  local cap = capacity()
  if cap == nil then return math.huge end
  return cap - call('HLEN', K.slots) / 2 - S.ng
end

local function new_slot_id()
  return S.name .. ':' .. string.format('%d', call('HINCRBY', K.cfg, 'sseq', 1))
end
