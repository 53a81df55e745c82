-- tenants.lua: pauses, bounded waiting and recent admissions of one queue
-- (admission/tenants.py, TenantSteps). Needs keys.lua, state.lua, key_rules.lua and
-- lines.lua.
--   S.pu     the end of the operator's pause of the queue (math.huge: until resumed)
--   paused   hash  key -> the end of that key's pause (%.17g; "inf": until resumed); S.kpu the
--                  latest end of any (nil or past: no key is paused, nothing is read)
--   adm:<b>  hash  key -> admissions in bucket b (NOW / C_RECENT_BUCKET), fairness="key" only
--   S.mw the queue's max_waiting, S.nref the refusals counted

local function queue_paused()
  if S.pu ~= nil and S.pu > NOW then return S.pu end
  return nil
end

local function key_pause(key)
  if S.kpu == nil or S.kpu <= NOW then return nil end
  local until_ = tonumber(call('HGET', K.paused, key))
  if until_ == nil then return nil end
  if until_ <= NOW then
    call('HDEL', K.paused, key)
    return nil
  end
  return until_
end

-- The end of the pause that holds a ticket of *key* (math.huge: none), or nil.
local function pause_end(key)
  local q, k = queue_paused(), key_pause(key)
  if q == nil then return k end
  if k == nil or q > k then return q end
  return k
end

-- TenantSteps.refusal: {bound, "q" (the queue's) / "o" (the key's own) / "d" (the per-key
-- default)} for a ticket of *key* that would start waiting now, or nil.
local function refusal(key)
  if S.mw ~= nil and S.nw >= S.mw then return {S.mw, 'q'} end
  local r = key_rules(key)
  if r.maxw ~= nil and waiting_of(key) >= r.maxw then
    if r.own_bound then return {r.maxw, 'o'} end
    return {r.maxw, 'd'}
  end
  return nil
end

-- TenantSteps.admitted_now: one admission of *key*, counted in its bucket.
local function admitted_now(key)
  if S.fair ~= 'key' then return end
  local adm = BASE .. 'adm:' .. string.format('%d', math.floor(NOW / C_RECENT_BUCKET))
  if call('HINCRBY', adm, key, 1) == 1 then call('PEXPIRE', adm, C_RECENT_TTL_MS) end
end
