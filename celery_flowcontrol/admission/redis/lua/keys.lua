-- keys.lua: the redis keys of one queue, the common arguments and the encodings (the Lua side
-- of codec.py). The first module of every admission script: scripts.py sends each operation
-- script after the modules it declares, in their order, under a header `local C_<NAME> = ...`
-- of the constants the scripts share with Python. Each EVALSHA is one atomic decision.
--
-- KEYS[1]  <prefix>:{<queue>}:cfg, the queue's config hash. Every other redis key of the queue
--          is derived from it, so all of them share the hash tag {<queue>} (one cluster slot):
--            cfg       hash   S and sseq (state.lua), the config JSON, restore marks (restore.lua)
--            leases    zset   instance -> lease expiry
--            held:<i>  set    slot ids held by instance <i>
--            slots     hash   slot id -> msgpack {holder, task, fairness key, label, acquired,
--                             expires|false, true if not in keycount (else false or absent),
--                             the admission's charge (quota.lua's quota_consume) or
--                             false/absent where it charged 1 per call only}, and
--                             ":" .. task id -> the slot id that task holds (slot ids never
--                             start with ":"; one hash, so one write sets or drops both)
--            holds     zset   slot id -> max_hold expiry
--            keycount  hash   fairness key -> slots + grants of that key. Read only under a
--                             per-key cap, so admit's fast path leaves a slot out of it while
--                             the queue has none (and marks the slot so); register.lua counts
--                             such slots when a cap comes
--            grants    hash   task id -> msgpack {slot id, granted, expires, hold|false, waiter...}
--            gexp      zset   task id -> grant expiry
--            waiting   hash   task id -> msgpack {priority, fairness key, label, seq, instance,
--                             since, expires, cost}
--            wexp      zset   task id -> waiter expiry
--            line:<g>  zset   one line per group key <g>: score -priority, member ORD .. task id
--            ring      zset   the lines by their head: score -priority, member VT .. ORD .. <g>
--            ringent   hash   group key -> its ring member
--            vtime     hash   group key -> virtual time (fairness="key")
--            rate:<i>  zset   sliding window log of the queue's limit i (quota.lua)
--            relrate   hash   epoch (ms) -> the release rate's sum in it (release_fast.lua)
--            kw:, kl:, kidx, rline, rlined: a fairness key's windows, the rate line (quota.lua)
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
-- double the reference computes. Sorted lines: lines.lua.
-- A missing queue answers C_UNKNOWN, turned into UnknownQueueError.

local BASE = string.sub(KEYS[1], 1, -4)  -- each redis key is BASE .. <part> (K: key_table.lua)

-- Now, in float seconds and in whole ms as a string (NOW_MS .. 'e-3' is NOW exactly, to Redis),
-- set by clock() (state.lua), which load() calls; S, the queue's state record (nil until load()),
-- and DIRTY, whether this call changed it (state.lua). Declared here, for admit's fast path.
local NOW, NOW_MS
local S, DIRTY = nil, false
local call, sub = redis.call, string.sub

local function fmt(x) return string.format('%.17g', x) end
