-- reads.lua: what an operator reads that no decision needs: the waiters in the order they
-- will be served (Lines.ordered in admission/lines.py). Needs keys.lua, state.lua and
-- lines.lua.

local function waiter_reply(w)
  return {w.task, w.prio, w.key, w.label, w.seq, w.inst, fmt(w.since), fmt(w.exp),
          fmt(w.cost or 1)}
end

-- A heap of ring entries {score, reserve flag, tag, ORD, group key}, least first.
local function entry_less(a, b)
  for i = 1, 4 do
    if a[i] ~= b[i] then return a[i] < b[i] end
  end
  return bytes_less(a[5], b[5])
end

local function heap_push(h, e)
  h[#h + 1] = e
  local i = #h
  while i > 1 do
    local p = math.floor(i / 2)
    if not entry_less(h[i], h[p]) then break end
    h[i], h[p] = h[p], h[i]
    i = p
  end
end

local function heap_pop(h)
  local top = h[1]
  h[1] = h[#h]
  h[#h] = nil
  local i, n = 1, #h
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and entry_less(h[l], h[m]) then m = l end
    if r <= n and entry_less(h[r], h[m]) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top
end

-- Up to *limit* waiters in serving order, as replies: replays the ring as grants would walk
-- it (a heap of the lines that moved on, merged with the ring read in order).
local function ordered_waiters(limit)
  local out, heap, pos, tags = {}, {}, {}, {}
  local ring, rpos, rnext = {}, 1, 0  -- buffered ring entries; the next ring rank to read
  local batch = math.min(math.max(limit, 1), 256)
  while #out < limit do
    if rpos > #ring and rnext >= 0 then
      local r = call('ZRANGE', K.ring, rnext, rnext + batch - 1, 'WITHSCORES')
      ring, rpos = {}, 1
      for i = 1, #r, 2 do
        local flag, rank, o2, gk = parse_ring(r[i])
        ring[#ring + 1] = {tonumber(r[i + 1]), flag, rank, o2, gk}
      end
      if #r < 2 * batch then rnext = -1 else rnext = rnext + batch end
    end
    local re, he = ring[rpos], heap[1]
    local e
    if he ~= nil and (re == nil or entry_less(he, re)) then
      e = heap_pop(heap)
    elseif re ~= nil then
      e = re
      rpos = rpos + 1
    else
      break
    end
    local gk = e[5]
    local i = pos[gk] or 0
    local m = call('ZRANGE', line_rkey(gk), i, i + 1, 'WITHSCORES')
    local w = get_waiter(sub(m[1], 12))
    out[#out + 1] = waiter_reply(w)
    pos[gk] = i + 1
    if #m > 2 then
      local rank = e[3]
      if S.fair == 'key' then  -- the tag moved on as take() would, ranked as refresh_line does
        tags[gk] = (tags[gk] or tag_of(gk)) + w.cost / key_rules(gk).weight
        rank = rank_of(gk, tags[gk])
      end
      heap_push(heap, {tonumber(m[4]), reserve_flag(gk, i + 1), rank, unord(m[3]), gk})
    end
  end
  return out
end
