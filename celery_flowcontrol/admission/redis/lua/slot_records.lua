-- slot_records.lua: the slot records of one queue, their per-key counts, and freeing one
-- (BusySlots.drop in admission/busy.py; busy.lua is the rest). Needs keys.lua only.
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

-- ON_COUNT.f, when lines.lua is sent, is told each key whose count moves (Lines.recount).
local ON_COUNT = {}

local function count(key)
  call('HINCRBY', K.keycount, key, 1)
  if ON_COUNT.f then ON_COUNT.f(key) end
end

local function uncount(key)
  if call('HINCRBY', K.keycount, key, -1) <= 0 then call('HDEL', K.keycount, key) end
  if ON_COUNT.f then ON_COUNT.f(key) end
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
