-- key_rules.lua: the settings in force for one fairness key (admission/key_rules.py,
-- KeyTable), read only for the keys a decision touches. Needs keys.lua and state.lua.
--   keyset   hash  key -> msgpack {weight, concurrency, reserve, max_waiting, windows (quota.lua's
--                  rate_config of its rate limits), their signature, their largest cost}, each
--                  its own or false (then the queue's per-key default applies), for every key
--                  with settings of its own (keys= or set_key: key_settings.lua); S.nks counts
--                  them (0: no read at all)
--   keyconf  hash  key -> its keys= entry (msgpack of KeyConfig.to_dict), from the config
--   keyover  hash  key -> its set_key override (JSON as Python wrote it, the fields set)
--   kbound   set   the keys whose own max_waiting is set (keys= or set_key)
-- The defaults come from S: pkc (per_key_concurrency), pkr (per_key_reserve), pkw
-- (per_key_max_waiting), kw/ksig (per_key_rate_limit's windows), cmax (the largest cost of
-- the queue's and per-key limits), qcmax (of the queue's alone).

local RULES = {}  -- the rules this call read, by key
local function key_rules(key)
  local r = RULES[key]
  if r ~= nil then return r end
  local raw = false
  if (S.nks or 0) > 0 then raw = call('HGET', K.keyset, key) end
  r = {weight = 1, conc = S.pkc, reserve = S.pkr or 0, maxw = S.pkw, own_bound = false,
       kw = S.kw, ksig = S.ksig or '', cmax = S.cmax, own = false}
  if raw then
    local a = cmsgpack.unpack(raw)
    r.own, r.weight = true, a[1]
    if a[2] then r.conc = a[2] end
    if a[3] then r.reserve = a[3] end
    if a[4] then r.maxw, r.own_bound = a[4], true end
    if a[5] then
      r.kw, r.ksig, r.cmax = a[5], a[6], S.qcmax
      if a[7] and (r.cmax == nil or a[7] < r.cmax) then r.cmax = a[7] end
    end
  end
  RULES[key] = r
  return r
end

-- How many slots and grants *key* holds (keycount is kept while any key may be capped).
local function held(key) return tonumber(call('HGET', K.keycount, key)) or 0 end
