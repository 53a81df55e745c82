-- grants.lua: freed slots reserved for waiters, by the waiter's task id and by expiry
-- (Grants in admission/queue_state.py), and their announcements. Needs keys.lua, state.lua
-- and busy.lua.
-- A grant is a table {id (its slot id), granted, exp, slot_exp (max_hold expiry or nil),
-- w (the waiter it was made for, lines.lua)}.

local function gunpack(task, s)
  local a = cmsgpack.unpack(s)
  return {id = a[1], granted = a[2], exp = a[3], slot_exp = a[4] or nil,
          w = {task = task, prio = a[5], key = a[6], label = a[7], seq = a[8], inst = a[9],
               since = a[10], exp = a[11], cost = a[12] or 1}}
end

local function gpack(g)
  local w = g.w
  return cmsgpack.pack({g.id, g.granted, g.exp, g.slot_exp or false, w.prio, w.key, w.label,
                        w.seq, w.inst, w.since, w.exp, w.cost or 1})
end

-- The announcements this call made, in order: release.lua and settle.lua return them too, so
-- the calling process hands a grant to its own waiter without waiting for its pub/sub copy.
local ANNOUNCED = {}

-- PUBLISH grant g (keys.lua: the payload); *n*, if given, numbers a repeat so it is distinct.
-- The waiter's instance (the worker that parked it) wakes it; see base.Grant.
local function announce(g, n)
  local fields = {S.name, g.w.task, g.id, fmt(g.granted), fmt(g.exp), g.w.inst}
  if n ~= nil then fields[7] = n end
  local payload = cjson.encode(fields)
  call('PUBLISH', CHANNEL, payload)
  ANNOUNCED[#ANNOUNCED + 1] = payload
end

local function add_grant(g)
  call('HSET', K.grants, g.w.task, gpack(g))
  set('ng', S.ng + 1)
  call('ZADD', K.gexp, fmt(g.exp), g.w.task)
  due_by(g.exp)
end

-- Drop the grant of *task*, its key uncounted (QueueState._drop_grant); the grant.
local function drop_grant(task)
  local g = gunpack(task, call('HGET', K.grants, task))
  call('HDEL', K.grants, task)
  set('ng', S.ng - 1)
  call('ZREM', K.gexp, task)
  uncount(g.w.key)
  return g
end

-- Keep the grant of *task* until at least *at* (its waiter came back while a window was spent).
local function extend_grant(task, at)
  local g = gunpack(task, call('HGET', K.grants, task))
  if at > g.exp then
    g.exp = at
    call('HSET', K.grants, task, gpack(g))
    call('ZADD', K.gexp, fmt(at), task)
  end
end
