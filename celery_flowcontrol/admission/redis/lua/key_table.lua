-- key_table.lua: K.<part>, the redis key BASE .. <part> (keys.lua), built on first use. Sent right
-- after keys.lua, but in admit after admit_fast.lua, which returns before most calls would use K
-- (or these functions).
local K = setmetatable({cfg = KEYS[1]}, {__index = function(k, part)
  local rkey = BASE .. part
  rawset(k, part, rkey)
  return rkey
end})
local function held_rkey(instance) return BASE .. 'held:' .. instance end
local function rate_rkey(i) return BASE .. 'rate:' .. i end  -- the queue's sliding log i
