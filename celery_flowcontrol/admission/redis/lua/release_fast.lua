-- release_fast.lua: release.lua's start, and its fast path. Sent before the modules only a
-- grant pass needs (scripts.py), as admit_fast.lua is. Arguments and replies: release.lua.
-- Frees the slot; with no waiter in any line there is no grant to make, and nothing else
-- to read.
if not drop_slot(ARGV[6]) then return 0 end  -- also when the queue does not exist
if call('EXISTS', K.ring) == 0 then return 1 end
