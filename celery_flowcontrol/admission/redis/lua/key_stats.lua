-- key_stats.lua: RedisBackend.key_stats, the busiest keys of a queue (TenantSteps.key_stats):
-- every key that holds slots or grants, waits, has settings of its own or is paused (by
-- pause or backoff), by busy + waiting, most first.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   how many keys at most
-- Returns   {{key, busy, waiting, paused until ("" none, "inf" no end), admitted in the last
--           two buckets, its set_key override (JSON) or ""}, ...}, or -1 if the queue is
--           unknown. (The caller resolves the settings from the config and the override.)
if not load() then return C_UNKNOWN end
local rows, order = {}, {}
local function row(key)
  local r = rows[key]
  if r == nil then
    r = {key = key, busy = 0, waiting = 0}
    rows[key] = r
    order[#order + 1] = r
  end
  return r
end
local all = call('HGETALL', K.slots)
for i = 1, #all, 2 do
  if sub(all[i], 1, 1) ~= ':' then
    local r = row(sunpack(all[i], all[i + 1]).key)
    r.busy = r.busy + 1
  end
end
all = call('HGETALL', K.grants)
for i = 2, #all, 2 do
  local r = row(cmsgpack.unpack(all[i])[6])
  r.busy = r.busy + 1
end
all = call('HGETALL', K.waiting)
for i = 1, #all, 2 do
  local r = row(wunpack(all[i], all[i + 1]).key)
  r.waiting = r.waiting + 1
end
for _, key in ipairs(call('HKEYS', K.keyset)) do row(key) end
all = call('HGETALL', K.paused)
for i = 1, #all, 2 do
  local u = tonumber(all[i + 1])
  if u > NOW then row(all[i]).paused = u end
end
all = call('ZRANGEBYSCORE', K.kbo, '(' .. fmt(NOW), '+inf', 'WITHSCORES')
for i = 1, #all, 2 do
  local r, u = row(all[i]), tonumber(all[i + 1])
  if r.paused == nil or u > r.paused then r.paused = u end
end
table.sort(order, function(a, b)
  local x, y = a.busy + a.waiting, b.busy + b.waiting
  if x ~= y then return x > y end
  return bytes_less(a.key, b.key)
end)
local bucket = math.floor(NOW / C_RECENT_BUCKET)
local now_b = BASE .. 'adm:' .. string.format('%d', bucket)
local last_b = BASE .. 'adm:' .. string.format('%d', bucket - 1)
local out = {}
for i = 1, math.min(#order, tonumber(ARGV[6])) do
  local r = order[i]
  local adm = (tonumber(call('HGET', now_b, r.key)) or 0) + (tonumber(call('HGET', last_b, r.key)) or 0)
  out[i] = {r.key, r.busy, r.waiting, r.paused and fmt(r.paused) or '', adm,
            call('HGET', K.keyover, r.key) or ''}
end
return out
