-- reclaim_fast.lua: reclaim.lua's start, and its fast path. Sent after keys.lua and state.lua
-- only (scripts.py): each "local function" a script passes costs every call a closure, and the
-- beat task's pass (flowcontrol.reclaim) reads every registered queue, most of which have
-- nothing to expire at any instant. Arguments and replies: reclaim.lua.
-- Nothing is due before S.nd (state.lua's nothing_due: leases, holds, grants and waiters) and
-- no key's windows lapse before the first score of kidx (quota.lua's prune_keys): then
-- expire() would change nothing, and the answer is four zeros.
if not load() then return C_UNKNOWN end
if nothing_due() then
  local k = call('ZRANGE', K.kidx, 0, 0, 'WITHSCORES')
  if #k == 0 or tonumber(k[2]) >= NOW then
    save()  -- nothing_due() may have raised S.nd
    return {0, 0, 0, 0}
  end
end
