-- deadlines-claim: the pods whose deadline has fallen due, each claimed for a while so that of several
-- control workers polling at once only one delivers it. A claim that is not followed by a new state
-- (the worker died before the DEADLINE event was queued) falls due again when it runs out.
--
-- KEYS[1] deadline index     <prefix>deadlines     sorted set: uid scored by its deadline (ms)
-- ARGV[1] now (ms, the fleet's clock: deadlines are computed from the events' own times)
-- ARGV[2] claim (ms): a claimed deadline is due again this long after now
-- ARGV[3] at most this many
--
-- Returns the uids claimed.

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local again = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, uid in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', again, uid)
end
return due
