-- windows.lua: the maths of one rate window, fixed, sliding or GCRA (admission/windows.py, the
-- reference: the state-machine test holds the two to the same answers). Needs keys.lua only:
-- admit's fast path runs right after it.
--
-- win(op, c, st, log, ...) is every step of the maths, op naming which (below). One function: a
-- script makes a closure of each function it passes, on every call, and one per step and helper
-- were ten closures and a table on each windowed call (two steps: 'retry', then 'consume').
--
-- A window is its config c {a = algorithm, l = limit, p = period, b = burst, c = true if
-- per="cost", ad = true if adaptive, and for an adaptive one live, since} and its state st {w, n
-- (fixed: window number and count), tat (gcra), q (sliding: last seq), s (sliding per cost: the
-- sum), dirty}; a queue's window is one table for both. dirty tells key_save a key's state changed;
-- a queue's window lives in S, whose change DIRTY records, so it is left unmarked (S would carry
-- the mark, packed and unpacked on every call). A sliding window's log is a zset: score time,
-- member %014x seq, and for a per-cost window the charge after it (%.17g).
--
--   win('retry', c, st, log, cost)    nil if the ticket's cost may pass now, else the instant it
--                                     may (RateWindow.retry_at; the charge is the cost for a
--                                     per-cost window, else 1: RateWindow.charge_of)
--   win('consume', c, st, log, cost)  record its charge now (after 'retry' said yes); a token
--   win('settle', c, st, log, token, charged, actual)  correct a charge made under token
--   win('used', c, st, log)           how much of the limit is in use now (for operators)
--   win('end', c, st, log)            after this instant the window is empty (RateWindow.end)
--   win('leaves', c, st, log, i)      when entry i (from 0, oldest first) of sliding log leaves
--                                     its span
--   win('limit', c)                   the live limit: adaptive limits regain a tenth of the
--                                     ceiling (at least 1) per whole period (AIMD)

-- The sliding logs this call trimmed (false), or trimmed and charged (when: NOW): at one NOW a
-- second trim finds nothing to drop, and a charge made now is the log's newest entry. Made on the
-- first trim.
local LOGS

-- win holds no outer name but LOGS, NOW, NOW_MS, DIRTY and C_EPSILON: each one a closure holds
-- costs every call of the script, windowed or not (redis.call and string.format: its own locals).
local function win(op, c, st, log, x, charged, actual)
  local call, format = redis.call, string.format
  if op == 'end' then
    if c.a == 'fixed' then return (st.w + 1) * c.p end
    if c.a == 'gcra' then return st.tat end
    if LOGS ~= nil and LOGS[log] then return LOGS[log] + c.p end
    local last = call('ZRANGE', log, -1, -1, 'WITHSCORES')
    if #last > 0 then return tonumber(last[2]) + c.p end
    return -math.huge
  end
  if op ~= 'leaves' then
    -- The live limit, of 'limit' and of the steps that read it ('retry', and GCRA's).
    local limit = c.l
    if c.ad and (op == 'retry' or op == 'limit' or c.a == 'gcra') then
      if c.since == nil then
        c.since = NOW
        DIRTY = true
      end
      local n = math.floor((NOW - c.since) / c.p)
      if n > 0 then
        c.live = math.min(c.l, c.live + n * math.max(1, math.floor(c.l / 10)))
        c.since = c.since + n * c.p
        DIRTY = true
      end
      limit = c.live
    end
    if op == 'limit' then return limit end
    -- The other steps take the window to NOW first: a fixed window to the one holding NOW,
    -- counted in whole microseconds (windows.py fixed_window); a sliding log trimmed of what
    -- left its span.
    local window
    if c.a == 'fixed' then
      window = math.floor(math.floor(NOW * 1e6 + 0.5) / math.max(1, math.floor(c.p * 1e6 + 0.5)))
      if window ~= st.w then
        st.w, st.n = window, 0
        DIRTY = true
      end
    elseif c.a == 'sliding' and (LOGS == nil or LOGS[log] == nil) then
      if LOGS == nil then LOGS = {} end
      LOGS[log] = false
      local edge = '(' .. format('%.17g', NOW - c.p)
      if not c.c then
        call('ZREMRANGEBYSCORE', log, '-inf', edge)
      else
        local gone = call('ZRANGEBYSCORE', log, '-inf', edge)
        for _, m in ipairs(gone) do st.s = st.s - tonumber(string.sub(m, 15)) end
        if #gone > 0 then
          call('ZREMRANGEBYSCORE', log, '-inf', edge)
          DIRTY = true
          if st ~= c then st.dirty = true end
        end
        if st.s ~= 0 and call('EXISTS', log) == 0 then
          st.s, DIRTY = 0, true
          if st ~= c then st.dirty = true end
        end
      end
    end
    if op == 'retry' then
      local charge = 1
      if c.c then charge = x end
      if c.a == 'gcra' then
        local allow_at = st.tat - c.p / limit * (c.b - charge)
        if NOW >= allow_at then return nil end
        return allow_at
      end
      if charge > limit then  -- when an adaptive limit will have risen to it
        return c.since + math.ceil((charge - limit) / math.max(1, math.floor(c.l / 10))) * c.p
      end
      if c.a == 'fixed' then
        if st.n + charge <= limit then return nil end
        return (window + 1) * c.p
      end
      local sum = st.s  -- the log's total: its charges, or for a per-call log its entries
      if not c.c then sum = call('ZCARD', log) end
      if sum + charge <= limit then return nil end
      if c.c then
        local rest = sum
        local all = call('ZRANGE', log, 0, -1, 'WITHSCORES')
        for i = 1, #all, 2 do
          rest = rest - tonumber(string.sub(all[i], 15))
          if rest + charge <= limit then return tonumber(all[i + 1]) + c.p + C_EPSILON end
        end
        return nil
      end
      x = sum - limit  -- each entry counts 1: the x-th oldest must leave first ('leaves' below)
    elseif op == 'consume' then
      local charge = 1
      if c.c then charge = x end
      DIRTY = true
      if st ~= c then st.dirty = true end
      if c.a == 'fixed' then
        st.n = st.n + charge
        return window
      elseif c.a == 'sliding' then
        st.q = st.q + 1
        local member = format('%014x', st.q)
        if c.c then
          member = member .. format('%.17g', charge)
          st.s = st.s + charge
        end
        call('ZADD', log, NOW_MS .. 'e-3', member)
        LOGS[log] = NOW
        return st.q
      end
      st.tat = math.max(st.tat, NOW) + c.p / limit * charge
      return 0
    elseif op == 'settle' then  -- x: the token
      DIRTY = true
      if st ~= c then st.dirty = true end
      if c.a == 'fixed' then
        if window == x then st.n = math.max(0, st.n + (actual - charged)) end
      elseif c.a == 'sliding' then
        local head = format('%014x', x)
        local all = call('ZRANGE', log, 0, -1, 'WITHSCORES')
        for i = 1, #all, 2 do
          if string.sub(all[i], 1, 14) == head then
            call('ZREM', log, all[i])
            call('ZADD', log, all[i + 1], head .. format('%.17g', actual))
            st.s = math.max(0, st.s + (actual - tonumber(string.sub(all[i], 15))))
            break
          end
        end
      else
        st.tat = math.max(math.max(st.tat, NOW) + c.p / limit * (actual - charged), NOW)
      end
      return nil
    else  -- 'used'
      if c.a == 'fixed' then return st.n end
      if c.a == 'sliding' then
        if c.c then return st.s end
        return call('ZCARD', log)
      end
      return math.max(0, math.ceil((st.tat - NOW) / (c.p / limit) - 1e-9))
    end
  end
  -- 'leaves', and 'retry' of a full per-call log: when entry x (from 0, oldest first) of sliding
  -- log *log* leaves its span.
  return tonumber(call('ZRANGE', log, x, x, 'WITHSCORES')[2]) + c.p + C_EPSILON
end
