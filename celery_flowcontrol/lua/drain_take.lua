-- drain_take: take the oldest messages of flooded flow queues off kombu Redis lists, as
-- kombu's consumer would take them, and record each as delivered and unacked (kombu's own
-- QoS.append), atomically.
--
-- KEYS[1]   the channel's unacked hash (delivery tag -> json [payload, exchange, routing key])
-- KEYS[2]   the channel's unacked index (sorted set: delivery tag by the time it was taken)
-- KEYS[3..] the lists the consumer reads, in the order its BRPOP reads them
-- ARGV[1]   now (epoch seconds, the worker's clock: kombu's visibility check reads that clock)
-- ARGV[2]   how many messages at most, over every list
-- ARGV[3]   json array: the flooded flow queues (a message of any other stops its list)
-- ARGV[4]   json array: the flow_* headers a taken message may carry (any other stops its list)
-- C_QUEUE_HEADER (from Python at load) names a message's flow queue.
-- Returns   a flat array: list number (1-based over KEYS[3..]), payload, list number, payload...
--
-- A list is read from its tail (kombu pushes on the left and pops on the right: the tail is the
-- oldest), one message at a time, and left at its first message that does not qualify, so the
-- consumer's order of everything it runs stays as it was.

local now, most = ARGV[1], tonumber(ARGV[2])
local flooded, allowed = {}, {}
for _, q in ipairs(cjson.decode(ARGV[3])) do flooded[q] = true end
for _, h in ipairs(cjson.decode(ARGV[4])) do allowed[h] = true end
local null = cjson.null

local function present(v)
  return v ~= nil and v ~= null and v ~= false
end

-- The delivery tag, exchange and routing key of a payload the drainer may take, else nil.
local function qualifies(payload)
  local ok, m = pcall(cjson.decode, payload)
  if not ok or type(m) ~= 'table' then return nil end
  local h, p = m['headers'], m['properties']
  if type(h) ~= 'table' or type(p) ~= 'table' then return nil end
  local info = p['delivery_info']
  if type(info) ~= 'table' or type(p['delivery_tag']) ~= 'string' then return nil end
  if type(h['id']) ~= 'string' or type(h['task']) ~= 'string' then return nil end
  if not flooded[h[C_QUEUE_HEADER]] then return nil end
  -- What the normal path decides alone: a countdown, an expiry, a second delivery.
  if present(h['eta']) or present(h['expires']) or present(h['redelivered'])
      or present(info['redelivered']) or present(p['expiration']) then
    return nil
  end
  for name, _ in pairs(h) do
    if type(name) == 'string' and string.sub(name, 1, 5) == 'flow_' and not allowed[name] then
      return nil  -- collapse options, acquire_slot, a wake's copy...
    end
  end
  local ex, rk = info['exchange'], info['routing_key']
  if type(ex) ~= 'string' or type(rk) ~= 'string' then return nil end
  return p['delivery_tag'], ex, rk
end

local out = {}
local taken = 0
for i = 3, #KEYS do
  local list = KEYS[i]
  while taken < most do
    local payload = redis.call('LINDEX', list, -1)
    if not payload then break end
    local tag, ex, rk = qualifies(payload)
    if not tag then break end
    redis.call('RPOP', list)
    -- kombu's QoS.append: the value is json [payload, exchange, routing key]; the payload is
    -- kept as the broker held it, byte for byte.
    redis.call('HSET', KEYS[1], tag, '[' .. payload .. ',' .. cjson.encode(ex) .. ','
                                      .. cjson.encode(rk) .. ']')
    redis.call('ZADD', KEYS[2], now, tag)
    taken = taken + 1
    out[#out + 1] = i - 2
    out[#out + 1] = payload
  end
end
return out
