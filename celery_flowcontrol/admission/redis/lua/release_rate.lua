-- release_rate.lua: RedisBackend.release_rate, how many slots the queue gave back per second
-- lately: the decayed count release_fast.lua keeps in the string key rr.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- Returns   the rate at now as a %.17g string ("0" before the first release), or -1 if the
--           queue is unknown.
if not load() then return C.UNKNOWN end
local rr = call('GET', K.rr)
if not rr then return '0' end
local sp = string.find(rr, ' ', 1, true)
local since = math.max(0, NOW * 1000 - tonumber(sub(rr, sp + 1)))
return fmt(tonumber(sub(rr, 1, sp - 1)) * math.exp(-since / (1000 * C.RELEASE_TAU)))
