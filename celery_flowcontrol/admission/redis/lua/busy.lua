-- busy.lua: the busy slots of one queue and the instance leases that keep them
-- (admission/busy.py, BusySlots; the records and drop_slot are in slot_records.lua). Needs
-- keys.lua, state.lua and slot_records.lua.

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
