-- register.lua: RedisBackend.register, create a queue or replace its config
-- (QueueState.__init__ / QueueState.configure + grant_pass).
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   config JSON (QueueConfig.to_dict, for get_config)      ARGV[7]  name
-- ARGV[8]   concurrency or ""       ARGV[9]  per_key_concurrency or ""   ARGV[10] retry (s)
-- ARGV[11]  fairness                ARGV[12] order                       ARGV[13] max_hold or ""
-- ARGV[14]  release ("on_result" or "manual")
-- ARGV[15]  the config JSON get_config reads ("": ARGV[6])   ARGV[16] the generation of its
--           keys= ("" for none)
-- (The rate limits are read from the config JSON: quota.lua's configure_rates. ARGV[6] leaves
-- keys= out: register_keys.lua writes them, a chunk per call, and grants at the last.)
-- Returns   {1 if the queue is new else 0 (its config replaced: slots, waiters and overrides
--           kept; a rate window restarts only if the rate limits changed), 1 if keys= entries
--           are to be written (register_keys.lua) else 0}.
local conf = config_of(6)
call('HSET', K.cfg, 'json', ARGV[15] ~= '' and ARGV[15] or ARGV[6])
if not load() then
  clock()  -- load() reads it only for a queue that exists
  S = conf
  S.seq, S.vclock, S.nw, S.ng = 0, 0, 0, 0  -- the slot sequence (sseq) starts at 0
  S.kgen, S.kdone = '', ''
  configure_rates(ARGV[6])
  local pending = configure_keys(ARGV[6], ARGV[16])
  DIRTY = true
  save()
  return {1, pending and 1 or 0}
end
local old = {fair = S.fair, order = S.order, grouped = grouped(), counting = counting(),
             pkr = S.pkr}
for _, f in ipairs({'name', 'cap', 'pkc', 'retry', 'fair', 'order', 'hold', 'rel'}) do
  set(f, conf[f])  -- conf[f] may be nil: the field goes
end
configure_rates(ARGV[6])
local pending = configure_keys(ARGV[6], ARGV[16])
-- The lines are placed for the new config before slots are counted: a count moves a line
-- (ON_COUNT), which under a new fairness would read tags the old lines never kept.
if call('EXISTS', K.ring) == 1 and (old.grouped ~= grouped() or old.order ~= S.order
                                     or old.fair ~= S.fair) then
  rebuild_lines()
elseif old.pkr ~= S.pkr then
  -- Every key's default reserve changed: every waiting line is placed again (its tag kept).
  for _, gk in ipairs(call('HKEYS', K.ringent)) do rekey(gk) end
end
track_counts(old.counting)
if not pending then grant_pass() end
save()
return {0, pending and 1 or 0}
