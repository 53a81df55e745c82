-- register.lua: RedisBackend.register, create a queue or replace its config
-- (QueueState.__init__ / QueueState.configure + grant_pass).
-- Follows keys.lua (KEYS, common ARGV, key layout); prelude.lua and queue_state.lua at its top.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   config JSON (QueueConfig.to_dict, for get_config)      ARGV[7]  name
-- ARGV[8]   concurrency or ""       ARGV[9]  per_key_concurrency or ""   ARGV[10] retry (s)
-- ARGV[11]  fairness                ARGV[12] order                       ARGV[13] max_hold or ""
-- ARGV[14]  rate algorithm or ""    ARGV[15] rate limit or ""            ARGV[16] rate period or ""
-- ARGV[17]  rate burst or ""         ARGV[18] release ("on_result" or "manual")
-- Returns   1 if the queue is new, 0 if its config was replaced (slots, waiters and
--           overrides kept; the rate window restarts only if the rate limit changed).
local conf = {name = ARGV[7], cap = tonumber(ARGV[8]), pkc = tonumber(ARGV[9]),
              retry = tonumber(ARGV[10]), fair = ARGV[11], order = ARGV[12],
              hold = tonumber(ARGV[13]), ra = opt(ARGV[14]), rl = tonumber(ARGV[15]),
              rp = tonumber(ARGV[16]), rb = tonumber(ARGV[17]), rel = ARGV[18]}
call('HSET', K.cfg, 'json', ARGV[6])
if not load() then
  S = conf
  S.seq, S.sseq, S.vclock, S.rseq, S.fw, S.fc, S.tat, S.nw, S.ng = 0, 0, 0, 0, -1, 0, 0, 0, 0
  DIRTY = true
  save()
  return 1
end
local old = {ra = S.ra, rl = S.rl, rp = S.rp, rb = S.rb, fair = S.fair, order = S.order,
             grouped = grouped(), pkc = S.pkc}
for _, f in ipairs({'name', 'cap', 'pkc', 'retry', 'fair', 'order', 'hold', 'ra', 'rl', 'rp',
                    'rb', 'rel'}) do
  set(f, conf[f])  -- conf[f] may be nil: the field goes
end
if old.ra ~= S.ra or old.rl ~= S.rl or old.rp ~= S.rp or old.rb ~= S.rb then
  call('DEL', K.rate)
  set('fw', -1)
  set('fc', 0)
  set('tat', 0)
end
if old.pkc == nil and S.pkc ~= nil then
  -- A per-key cap comes: count the slots admit.lua's fast path left out of keycount while
  -- there was none, before anything reads the counts.
  local all = call('HGETALL', K.slots)
  for i = 1, #all, 2 do
    if sub(all[i], 1, 1) ~= ':' then
      local sl = sunpack(all[i], all[i + 1])
      if sl.uncounted then
        count(sl.key)
        sl.uncounted = nil
        call('HSET', K.slots, sl.id, spack(sl))
      end
    end
  end
end
if call('EXISTS', K.ring) == 1 and (old.grouped ~= grouped() or old.order ~= S.order
                                     or old.fair ~= S.fair) then
  rebuild_lines()
end
grant_pass()
save()
return 0
