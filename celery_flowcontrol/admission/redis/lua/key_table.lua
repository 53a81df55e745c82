-- key_table.lua: K.<part>, the redis key BASE .. <part> (keys.lua), built on first use. Sent right
-- after keys.lua, but in admit after admit_fast.lua, which returns before most calls would use K.
local K = setmetatable({cfg = KEYS[1]}, {__index = function(k, part)
  local rkey = BASE .. part
  rawset(k, part, rkey)
  return rkey
end})
