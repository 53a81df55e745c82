-- key_settings.lua: a queue's per-key settings as config and set_key give them, resolved into
-- key_rules.lua's keyset (admission/key_rules.py, KeyTable.configure and set). Needs
-- keys.lua, state.lua, windows.lua, key_rules.lua, key_windows.lua, quota.lua
-- (rate_config, cost_cap) and lines.lua (refresh_line).

-- Lines.rekey: *key*'s weight or reserve may have changed; its line (if it waits) is placed
-- again from its tag, so the new settings count from the next decision on: a ring member
-- holds the rank and reserve flag it was made with. (Here, not in lines.lua: admit never
-- changes a key's settings.)
local function rekey(key)
  RULES[key] = nil
  local gk = group(key)
  if call('HEXISTS', K.ringent, gk) == 1 then refresh_line(gk) end
end

-- One key's keyset entry from its keys= entry and its set_key override (the override wins
-- field by field); none if it has neither.
local function resolve_key(key)
  local conf, over = call('HGET', K.keyconf, key), call('HGET', K.keyover, key)
  if not conf and not over then
    call('HDEL', K.keyset, key)
    call('SREM', K.kbound, key)
    return
  end
  local v = {}
  if conf then for f, x in pairs(cmsgpack.unpack(conf)) do v[f] = x end end
  if over then for f, x in pairs(cjson.decode(over)) do v[f] = x end end
  local kw, ksig, most = false, false, false
  if v.rate_limit ~= nil then
    kw, ksig = rate_config(v.rate_limit)
    most = cost_cap(kw, nil) or false
  end
  call('HSET', K.keyset, key, cmsgpack.pack({v.weight or 1, v.concurrency or false,
       v.reserve or false, v.max_waiting or false, kw, ksig, most}))
  if v.max_waiting then call('SADD', K.kbound, key) else call('SREM', K.kbound, key) end
end

-- Quota.refit: *key*'s limits changed (signature *old*): fresh windows of the new ones, a
-- backoff in force kept; nothing for a key without windows.
local function refit_key(key, old)
  RULES[key] = nil
  if key_rules(key).ksig == old or call('EXISTS', kw_rkey(key)) == 0 then return end
  local b = call('HGET', kw_rkey(key), 'b')
  local rkeys = {kw_rkey(key)}
  for i = 1, C_MAX_RATE_LIMITS do rkeys[#rkeys + 1] = kl_rkey(i, key) end
  call('DEL', unpack(rkeys))
  KEY_STATES[key] = nil
  local ks = key_state(key)
  ks.b, ks.dirty = tonumber(b), true
  key_save(ks)
end

-- S.kx (lines per key wherever keys may differ: key_rules.grouped) and S.nks, from the
-- per-key defaults and the keys with settings of their own (S.kk: the config has keys=); and the cfg hash's field "wb",
-- "1" if some call may meet a waiting bound (KeyTable.waiting_bounded), else "0": what a
-- producer reads, in one HGET, before it asks would_refuse.lua.
local function key_flags()
  -- Flags that are off, and counts of 0, are left out of S (absent reads as off and 0): S is
  -- unpacked and packed whole by every admission, a field each costing it.
  local nks = call('HLEN', K.keyset)
  set('nks', nks > 0 and nks or nil)
  set('kx', S.pkr ~= nil or S.pkw ~= nil or S.kk == true or call('EXISTS', K.keyconf) == 1
            or call('EXISTS', K.keyover) == 1 or nil)
  local bounded = S.mw ~= nil or S.pkw ~= nil or call('EXISTS', K.kbound) == 1
  call('HSET', K.cfg, 'wb', bounded and '1' or '0')
end

-- Take the per-key defaults of config JSON *json* into S, and *gen*, the generation of the
-- config's keys= ("" for none), whose entries register_keys.lua writes in chunks. True if
-- some are still to be written (or dropped): S.kdone is the generation last written in full,
-- cleared by a registration of another one, so one left half-written (a crash, or a newer
-- config that came between) is written again in full.
local function configure_keys(json, gen)
  local conf = cjson.decode(json)
  local function opt(x) if x == cjson.null then return nil end return x end
  set('pkr', opt(conf.per_key_reserve))
  set('pkw', opt(conf.per_key_max_waiting))
  set('mw', opt(conf.max_waiting))
  if S.kgen ~= gen then
    set('kgen', gen)
    set('kdone', nil)
  end
  set('kk', gen ~= '' or nil)
  key_flags()
  return S.kdone ~= gen
end
