-- lease-renew: extend a lease, only for the token it was granted with, whether or not it has expired.
-- Fencing is by token, not by time: another host that takes an expired lease (lease-acquire) draws a
-- new token, and the control plane's revoke or a release deletes the lease, so a renewal whose token
-- still matches means nobody took the lease and its holder may go on. Refusing it because expiresAt
-- passed would make a Redis outage longer than the TTL close every healthy shadow and relaunch every
-- pod. Once the key itself is gone (ttl + retain after the last grant or renewal, by PEXPIRE) the
-- renewal is 'lost' like any other.
--
-- KEYS[1] lease              <prefix>lease:<uid>
-- KEYS[2] lease index        <prefix>leases
-- ARGV[1] uid
-- ARGV[2] token
-- ARGV[3] ttl (ms)
-- ARGV[4] retain (ms), as in lease-acquire
--
-- Returns {1, expiresAt} when renewed, {0, 'lost'} when the lease is gone or has another token.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then
  return {0, 'lost'}
end

local expiresAt = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expiresAt', expiresAt)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[4]))
redis.call('ZADD', KEYS[2], expiresAt, ARGV[1])
return {1, expiresAt}
