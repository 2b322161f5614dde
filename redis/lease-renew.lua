-- lease-renew: extend a lease, only for the token it was granted with and only before it expires.
-- A holder that missed its renewals has lost the lease even if nobody took it yet: it must stop.
--
-- KEYS[1] lease              <prefix>lease:<uid>
-- KEYS[2] lease index        <prefix>leases
-- ARGV[1] uid
-- ARGV[2] token
-- ARGV[3] ttl (ms)
-- ARGV[4] retain (ms), as in lease-acquire
--
-- Returns {1, expiresAt} when renewed, {0, 'lost'} when the lease is gone or has another token,
-- {0, 'expired'} when it ran out first.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local cur = redis.call('HMGET', KEYS[1], 'token', 'expiresAt')
if not cur[1] or cur[1] ~= ARGV[2] then
  return {0, 'lost'}
end
if tonumber(cur[2]) <= now then
  return {0, 'expired'}
end

local expiresAt = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expiresAt', expiresAt)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[4]))
redis.call('ZADD', KEYS[2], expiresAt, ARGV[1])
return {1, expiresAt}
