-- release_rate.lua: RedisBackend.release_rate, how many slots the queue gave back per second
-- lately: the decayed count release_fast.lua keeps, by epoch, in the hash relrate.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- Returns   the rate at now as a %.17g string ("0" before the first release), or -1 if the
--           queue is unknown.
if not load() then return C_UNKNOWN end
local sums, now_ms, rate = call('HGETALL', K.relrate), NOW * 1000, 0
for i = 1, #sums, 2 do
  local since = now_ms - tonumber(sums[i])
  rate = rate + tonumber(sums[i + 1]) / C_RATE_UNIT * math.exp(-since / (1000 * C_RELEASE_TAU))
end
return fmt(rate)
