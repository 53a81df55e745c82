-- drain_give_back: messages the drainer took (drain_take.lua) go back to the consumer, each to
-- the tail of the list it came from (the next one the consumer takes), atomically.
--
-- KEYS[1]   the channel's unacked hash
-- KEYS[2]   the channel's unacked index
-- KEYS[3..] the list of each message, in the order of ARGV's messages
-- ARGV      delivery tag, payload, delivery tag, payload... newest first (the oldest is pushed
--           last: it ends at the tail)
-- Returns   how many went back
--
-- A message no longer in the unacked hash was given back already by kombu's own visibility
-- restore (the drainer held it past the visibility timeout): pushing it again would make two.

local back = 0
for i = 3, #KEYS do
  local tag, payload = ARGV[2 * (i - 2) - 1], ARGV[2 * (i - 2)]
  if redis.call('HDEL', KEYS[1], tag) == 1 then
    redis.call('RPUSH', KEYS[i], payload)
    back = back + 1
  end
  redis.call('ZREM', KEYS[2], tag)
end
return back
