-- busy.lua: the busy slots of one queue and the instance leases that keep them
-- (admission/busy.py, BusySlots; the records and drop_slot are in slot_records.lua). Needs
-- keys.lua, state.lua, slot_records.lua and key_rules.lua.

-- True if fairness key *key* holds all the slots its cap allows (its own, else the per-key
-- cap).
local function saturated(key)
  local cap = key_rules(key).conc
  if cap == nil then return false end
  return held(key) >= cap
end

-- True if keycount is kept: some key may have a cap or a reserve.
local function counting() return S.pkc ~= nil or S.kx == true end

-- Keycount is kept from now on (*was*: whether it was before): count the slots admit.lua's
-- fast path left out of it while it was not, before anything reads the counts.
local function track_counts(was)
  if was or not counting() then return end
  local all = call('HGETALL', K.slots)
  for i = 1, #all, 2 do
    if sub(all[i], 1, 1) ~= ':' then
      local sl = sunpack(all[i], all[i + 1])
      if sl.uncounted then
        count(sl.key)
        sl.uncounted = nil
        call('HSET', K.slots, sl.id, spack(sl))
      end
    end
  end
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
