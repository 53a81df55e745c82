-- pause.lua: RedisBackend.pause, admit nothing of the queue or of one key until an instant
-- (TenantSteps.pause).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   "q" for the queue, "k" for a key     ARGV[7]  the key
-- ARGV[8]   the end (epoch seconds), "" for none (until resumed)
-- Returns   1, or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
local until_ = math.huge
if ARGV[8] ~= '' then until_ = tonumber(ARGV[8]) end
if ARGV[6] == 'q' then
  set('pu', until_)
else
  call('HSET', K.paused, ARGV[7], fmt(until_))
  if S.kpu == nil or until_ > S.kpu then set('kpu', until_) end
end
save()
return 1
