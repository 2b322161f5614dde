-- outbox-claim: pods whose effects were written more than `ARGV[1]` ms ago and are still not cleared
-- (the worker that wrote them died before running them), each claimed for another `ARGV[1]` ms so that
-- of several control workers sweeping at once only one runs them again.
--
-- KEYS[1] outbox index       <prefix>outbox        sorted set: uid scored by when its effects were written
-- ARGV[1] age (ms) after which effects count as left behind, and how long a claim lasts
-- ARGV[2] at most this many
--
-- Returns the uids claimed.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[2]))
for _, uid in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', now, uid)
end
return due
