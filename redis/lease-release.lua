-- lease-release: give a lease up, only for the token it was granted with.
--
-- KEYS[1] lease              <prefix>lease:<uid>
-- KEYS[2] lease index        <prefix>leases
-- KEYS[3] review index       <prefix>review
-- ARGV[1] uid
-- ARGV[2] token
-- ARGV[3] look at the pod again this many ms from now: a shadow that ended on its own reports just
--         before it releases, and if that report never changes the pod, the control plane must notice
--
-- Returns 1 when released, 0 when the lease is gone or has another token.

if redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1])
return 1
