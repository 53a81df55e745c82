-- place.lua: RedisBackend.place, where one waiter stands in the order waiters are served.
-- KEYS[1]   <prefix>:{<queue>}:cfg
-- ARGV[6]   ticket id
-- Returns   {position (1 = next), ahead with a higher priority, ahead of other keys},
--           {} if it is not waiting, or -1 if the queue is unknown.
if not load() then return C_UNKNOWN end
local w = get_waiter(ARGV[6])
if w == nil then return {} end
if not grouped() then
  -- One line, sorted as it is served: its rank, and a count by score (0 - priority).
  local line = line_rkey('')
  local rank = call('ZRANK', line, ord(order2(w.seq)) .. w.task)
  if not rank then return {} end
  return {rank + 1, call('ZCOUNT', line, '-inf', '(' .. (0 - w.prio)), 0}
end
-- One line per key: the served order (reads.lua's walk), up to this waiter.
local higher, others = 0, 0
for i, r in ipairs(ordered_waiters(S.nw)) do
  if r[1] == w.task then return {i, higher, others} end
  if r[2] > w.prio then higher = higher + 1 end
  if r[3] ~= w.key then others = others + 1 end
end
return {}
