-- windows.lua: the maths of one rate window, fixed, sliding or GCRA (admission/windows.py, the
-- reference: the state-machine test holds the two to the same answers). Needs keys.lua only:
-- admit's fast path runs right after it.
--
-- window_maths() returns the functions for the locals below; a module that calls them makes them
-- first unless made: a script makes a closure of every function it passes, on every call, and most
-- admissions use no window at all. Returned, so window_maths holds none of the eight locals (a
-- closure costs each outer name it holds).
--
-- A window is its config c {a = algorithm, l = limit, p = period, b = burst, c = true if
-- per="cost", ad = true if adaptive, and for an adaptive one live, since} and its state st {w, n
-- (fixed: window number and count), tat (gcra), q (sliding: last seq), s (sliding per cost: the
-- sum), dirty}; a queue's window is one table for both. dirty tells key_save a key's state changed;
-- a queue's window lives in S, whose change DIRTY records, so it is left unmarked (S would carry
-- the mark, packed and unpacked on every call). A sliding window's log is a zset: score time,
-- member %014x seq, and for a per-cost window the charge after it (%.17g).

local charge_of, limit_at, win_leaves, win_retry, win_consume, win_settle, win_used, win_end

local function window_maths()
  local function charge_of(c, cost) if c.c then return cost end return 1 end

  -- The live limit: adaptive limits regain a tenth of the ceiling (at least 1) per whole period
  -- (AIMD). Small helpers are written into their callers: each function made is a closure,
  -- and an outer name for each that calls it, on every call.
  local function limit_at(c)
    if not c.ad then return c.l end
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
    return c.live
  end

  -- The fixed window holding NOW, counted in whole microseconds (windows.py fixed_window).
  local function roll(c, st)
    local window = math.floor(math.floor(NOW * 1e6 + 0.5)
                              / math.max(1, math.floor(c.p * 1e6 + 0.5)))
    if window ~= st.w then
      st.w, st.n = window, 0
      DIRTY = true
    end
    return window
  end

  -- The sliding logs this call trimmed (false), or trimmed and charged (when: NOW): at one NOW
  -- a second trim finds nothing to drop, and a charge made now is the log's newest entry.
  local LOGS = {}

  local function trim(c, st, log)
    if LOGS[log] ~= nil then return end
    LOGS[log] = false
    local edge = '(' .. fmt(NOW - c.p)
    if not c.c then
      call('ZREMRANGEBYSCORE', log, '-inf', edge)
      return
    end
    local gone = call('ZRANGEBYSCORE', log, '-inf', edge)
    for _, m in ipairs(gone) do st.s = st.s - tonumber(sub(m, 15)) end
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

  -- When entry i (from 0, oldest first) of sliding log *log* leaves its span.
  local function win_leaves(c, log, i)
    return tonumber(call('ZRANGE', log, i, i, 'WITHSCORES')[2]) + c.p + C_EPSILON
  end

  -- nil if a *charge* may pass now, else the instant it may (RateWindow.retry_at).
  local function win_retry(c, st, log, charge)
    if c.a == 'gcra' then
      local allow_at = st.tat - c.p / limit_at(c) * (c.b - charge)
      if NOW >= allow_at then return nil end
      return allow_at
    end
    local window
    if c.a == 'fixed' then window = roll(c, st) else trim(c, st, log) end
    local limit = limit_at(c)
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
    -- Each entry counts 1: the (sum - limit)-th oldest must leave first.
    if not c.c then return win_leaves(c, log, sum - limit) end
    local rest = sum
    local all = call('ZRANGE', log, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
      rest = rest - tonumber(sub(all[i], 15))
      if rest + charge <= limit then return tonumber(all[i + 1]) + c.p + C_EPSILON end
    end
  end

  -- Record a *charge* now (after win_retry said yes); a token for win_settle.
  local function win_consume(c, st, log, charge)
    DIRTY = true
    if st ~= c then st.dirty = true end
    if c.a == 'fixed' then
      local window = roll(c, st)
      st.n = st.n + charge
      return window
    elseif c.a == 'sliding' then
      trim(c, st, log)
      st.q = st.q + 1
      local member = string.format('%014x', st.q)
      if c.c then
        member = member .. fmt(charge)
        st.s = st.s + charge
      end
      call('ZADD', log, NOW_MS .. 'e-3', member)
      LOGS[log] = NOW
      return st.q
    end
    st.tat = math.max(st.tat, NOW) + c.p / limit_at(c) * charge
    return 0
  end

  -- Correct a *charged* amount (recorded under *token*) to *actual*.
  local function win_settle(c, st, log, token, charged, actual)
    DIRTY = true
    if st ~= c then st.dirty = true end
    if c.a == 'fixed' then
      if roll(c, st) == token then st.n = math.max(0, st.n + (actual - charged)) end
    elseif c.a == 'sliding' then
      trim(c, st, log)
      local head = string.format('%014x', token)
      local all = call('ZRANGE', log, 0, -1, 'WITHSCORES')
      for i = 1, #all, 2 do
        if sub(all[i], 1, 14) == head then
          call('ZREM', log, all[i])
          call('ZADD', log, all[i + 1], head .. fmt(actual))
          st.s = math.max(0, st.s + (actual - tonumber(sub(all[i], 15))))
          break
        end
      end
    else
      st.tat = math.max(math.max(st.tat, NOW) + c.p / limit_at(c) * (actual - charged), NOW)
    end
  end

  -- How much of the limit is in use now (for operators).
  local function win_used(c, st, log)
    if c.a == 'fixed' then
      roll(c, st)
      return st.n
    elseif c.a == 'sliding' then
      trim(c, st, log)
      if c.c then return st.s end
      return call('ZCARD', log)
    end
    return math.max(0, math.ceil((st.tat - NOW) / (c.p / limit_at(c)) - 1e-9))
  end

  -- After this instant the window is empty, as good as new (RateWindow.end).
  local function win_end(c, st, log)
    if c.a == 'fixed' then return (st.w + 1) * c.p end
    if c.a == 'gcra' then return st.tat end
    if LOGS[log] then return LOGS[log] + c.p end
    local last = call('ZRANGE', log, -1, -1, 'WITHSCORES')
    if #last > 0 then return tonumber(last[2]) + c.p end
    return -math.huge
  end
  return charge_of, limit_at, win_leaves, win_retry, win_consume, win_settle, win_used, win_end
end
