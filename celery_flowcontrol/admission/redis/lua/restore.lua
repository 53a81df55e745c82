-- restore.lua: RedisBackend.restore, re-assert the slots an instance holds after the queue's
-- state forgot it (QueueState.restore; a missing queue is created first, as register.lua
-- does, its slot sequence starting at sequence_floor(now)).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   instance
-- ARGV[7..17] the queue's config, as register.lua's ARGV[6..16] (a queue created here gets
--           its keys= from register_keys.lua after, as register.lua's)
-- ARGV[18..] six per slot: slot id, its number n, task id, fairness key, label,
--           acquired_at (s); then expires_at (s) or "" -- seven in all
-- Returns   {1 if the queue was created else 0, restored slot id, ...}
-- The instance is marked in the cfg hash (field "a:<instance>": it dies with the queue's
-- state); a mark whose instance has no live lease is dropped, so it restores again.
local instance = ARGV[6]
local created = 0
if not load() then
  clock()  -- load() reads it only for a queue that exists
  S = config_of(7)
  S.seq, S.vclock, S.nw, S.ng = 0, 0, 0, 0
  call('HSET', K.cfg, 'sseq', string.format('%d', math.floor(NOW * 1000) * 1000))  -- base.sequence_floor
  S.kgen, S.kdone = '', ''
  configure_rates(ARGV[7])
  configure_keys(ARGV[7], ARGV[17])
  DIRTY = true
  call('HSET', K.cfg, 'json', ARGV[16] ~= '' and ARGV[16] or ARGV[7])
  created = 1
end
for _, f in ipairs(call('HKEYS', K.cfg)) do
  if sub(f, 1, 2) == 'a:' then
    local at = tonumber(call('ZSCORE', K.leases, sub(f, 3)))
    if at == nil or at <= NOW then call('HDEL', K.cfg, f) end
  end
end
local mark = 'a:' .. instance
local known = call('HEXISTS', K.cfg, mark) == 1
lease(instance)
local out = {created}
if not known then
  call('HSET', K.cfg, mark, '1')
  local granted = {}
  for _, g in ipairs(call('HVALS', K.grants)) do granted[cmsgpack.unpack(g)[1]] = true end
  local seq = tonumber(call('HGET', K.cfg, 'sseq')) or 0
  for i = 18, #ARGV, 7 do
    local id, n, task = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
    local exp = tonumber(ARGV[i + 6])
    if n > seq then
      seq = n
      call('HSET', K.cfg, 'sseq', string.format('%d', n))
    end
    if not (granted[id] or call('HEXISTS', K.slots, id) == 1
            or call('HEXISTS', K.slots, ':' .. task) == 1 or (exp and exp <= NOW)) then
      -- Counted even past the capacity: the task runs, so admissions wait for it.
      count(ARGV[i + 3])
      add_slot({id = id, holder = instance, task = task, key = ARGV[i + 3], label = ARGV[i + 4],
                acquired = tonumber(ARGV[i + 5]), exp = exp})
      out[#out + 1] = id
    end
  end
end
save()
return out
