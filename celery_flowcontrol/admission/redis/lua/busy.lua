-- busy.lua: the busy slots of one queue and the instance leases that keep them
-- (admission/busy.py, BusySlots). Needs keys.lua and state.lua.
-- A slot is a table {id, holder, task, key (its fairness key), label, acquired, exp (max_hold
-- expiry or nil), uncounted (true if not in keycount), charge (quota.lua's, or nil)}.

local function spack(sl)
  return cmsgpack.pack({sl.holder, sl.task, sl.key, sl.label, sl.acquired, sl.exp or false,
                        sl.uncounted or false, sl.charge or false})
end

local function sunpack(id, s)
  local a = cmsgpack.unpack(s)
  return {id = id, holder = a[1], task = a[2], key = a[3], label = a[4], acquired = a[5],
          exp = a[6] or nil, uncounted = a[7] or nil, charge = a[8] or nil}
end

-- A slot as a reply (Redis truncates Lua numbers to integers: times go as strings).
local function slot_reply(sl)
  return {sl.id, sl.holder, sl.task, sl.key, sl.label, fmt(sl.acquired),
          sl.exp and fmt(sl.exp) or ''}
end

local function count(key) call('HINCRBY', K.keycount, key, 1) end

local function uncount(key)
  if call('HINCRBY', K.keycount, key, -1) <= 0 then call('HDEL', K.keycount, key) end
end

-- True if fairness key *key* holds all the slots its per-key cap allows.
local function saturated(key)
  if S.pkc == nil then return false end
  return (tonumber(call('HGET', K.keycount, key)) or 0) >= S.pkc
end

-- Record slot sl busy (its key counted by the caller).
local function add_slot(sl)
  call('HSET', K.slots, sl.id, spack(sl), ':' .. sl.task, sl.id)
  if sl.exp then
    call('ZADD', K.holds, fmt(sl.exp), sl.id)
    due_by(sl.exp)
  end
  call('SADD', held_rkey(sl.holder), sl.id)
end

-- Free slot *id*, its key uncounted; the slot, or nil if it was not busy.
local function drop_slot(id)
  local s = call('HGET', K.slots, id)
  if not s then return nil end
  local sl = sunpack(id, s)
  -- BusySlots checks of_task[task] == id first; a task holds one slot at most (admit
  -- readmits a busy task's slot, and a waiter or grantee holds none), so it always does.
  call('HDEL', K.slots, id, ':' .. sl.task)
  if sl.exp then call('ZREM', K.holds, id) end
  if not sl.uncounted then uncount(sl.key) end
  call('SREM', held_rkey(sl.holder), id)
  return sl
end

local function lease(instance)
  local at = NOW + INSTANCE_TTL
  call('ZADD', K.leases, fmt(at), instance)
  due_by(at)
end

-- Drop the leases run out (at most *limit* slots freed; nil: all) and, unless the queue's
-- slots are released by hand, free their slots; how many were freed.
local function lapse(limit)
  local freed = 0
  -- A manual queue's slots outlive their holder (work outside the worker): only release or
  -- max_hold frees them. The lease still goes.
  local manual = S.rel == 'manual'
  while true do
    local e = call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
    if #e == 0 or tonumber(e[2]) > NOW then break end
    local instance = e[1]
    call('ZREM', K.leases, instance)
    if not manual then
      for _, id in ipairs(call('SMEMBERS', held_rkey(instance))) do
        drop_slot(id)
        freed = freed + 1
      end
    end
    if limit and freed >= limit then break end
  end
  return freed
end
