-- key_windows.lua: the windows of one fairness key, stored apart per key and read at most
-- once a call (KeyState in admission/quota.py). Needs keys.lua, state.lua and windows.lua.
--   kw:<kg>:<key>   hash  the key's windows: w<i>, n<i>, t<i>, q<i>, s<i> (windows.lua), b its
--                   backoff end; kl:<kg>:<i>:<key> zset its sliding logs (<kg>: S.kg, quota.lua)
--   kidx      zset  "<kg>:<key>" -> when that key's windows are empty again (quota.lua)
-- A key's state is {key, b, win = {one window state per limit of the key (key_rules.lua's
-- kw: its own, else per_key_rate_limit's)}, kg, dirty}.

local function kw_rkey(key) return BASE .. 'kw:' .. S.kg .. ':' .. key end
local function kl_rkey(i, key) return BASE .. 'kl:' .. S.kg .. ':' .. i .. ':' .. key end

-- The redis keys of kidx member "<kg>:<key>", and its fairness key.
local function key_state_rkeys(member)
  local colon = string.find(member, ':', 1, true)
  local kg, key = sub(member, 1, colon - 1), sub(member, colon + 1)
  local rkeys = {BASE .. 'kw:' .. kg .. ':' .. key}
  for i = 1, C_MAX_RATE_LIMITS do rkeys[#rkeys + 1] = BASE .. 'kl:' .. kg .. ':' .. i .. ':' .. key end
  return rkeys, key
end

local KEY_STATES = {}  -- the key states this call read, by key (a decision reads one twice)
local function key_state(key)
  local known = KEY_STATES[key]
  if known ~= nil and known.kg == S.kg then return known end
  local raw = call('HGETALL', kw_rkey(key))
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = tonumber(raw[i + 1]) end
  local ks = {key = key, b = h.b, win = {}, kg = S.kg}
  KEY_STATES[key] = ks
  for i = 1, #(key_rules(key).kw or {}) do
    ks.win[i] = {w = h['w' .. i] or -1, n = h['n' .. i] or 0, tat = h['t' .. i] or 0,
                 q = h['q' .. i] or 0, s = h['s' .. i] or 0}
  end
  return ks
end

-- Write a key's windows back when they changed, and let them expire once empty.
local function key_save(ks)
  local dirty = ks.dirty
  local kw = key_rules(ks.key).kw or {}
  for i = 1, #kw do dirty = dirty or ks.win[i].dirty end
  if not dirty then return end
  local h, rkey = {}, kw_rkey(ks.key)
  local fin = ks.b or -math.huge
  for i, c in ipairs(kw) do
    local st = ks.win[i]
    if c.a == 'fixed' then
      h[#h + 1], h[#h + 2], h[#h + 3], h[#h + 4] = 'w' .. i, fmt(st.w), 'n' .. i, fmt(st.n)
    elseif c.a == 'gcra' then
      h[#h + 1], h[#h + 2] = 't' .. i, fmt(st.tat)
    else
      h[#h + 1], h[#h + 2], h[#h + 3], h[#h + 4] = 'q' .. i, fmt(st.q), 's' .. i, fmt(st.s)
    end
    local e = win('end', c, st, kl_rkey(i, ks.key))
    if e > fin then fin = e end
  end
  if ks.b then h[#h + 1], h[#h + 2] = 'b', fmt(ks.b) end
  if #h > 0 then call('HSET', rkey, unpack(h)) end
  call('ZADD', K.kidx, fmt(fin), S.kg .. ':' .. ks.key)
  local ttl = C_KEY_MARGIN_MS
  if fin > NOW then ttl = ttl + math.ceil((fin - NOW) * 1000) end
  call('PEXPIRE', rkey, ttl)
  for i, c in ipairs(kw) do
    if c.a == 'sliding' then call('PEXPIRE', kl_rkey(i, ks.key), ttl) end
  end
end

