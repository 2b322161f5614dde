-- lease-release: give a lease up, only for the token it was granted with.
--
-- KEYS[1] lease              <prefix>lease:<uid>
-- KEYS[2] lease index        <prefix>leases
-- ARGV[1] uid
-- ARGV[2] token
--
-- Returns 1 when released, 0 when the lease is gone or has another token.

if redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
