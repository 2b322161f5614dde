-- lease-revoke: the control plane takes a lease away from a shadow it has given up on (stopShadow):
-- deleted if held by that generation or an older one. Its holder sees the deletion at the next renewal
-- and closes the session; a newer generation can then take the lease at once.
--
-- KEYS[1] lease              <prefix>lease:<uid>
-- KEYS[2] lease index        <prefix>leases
-- ARGV[1] uid
-- ARGV[2] generation
--
-- Returns 1 when revoked, 0 when there was no lease of that generation or older.

local gen = redis.call('HGET', KEYS[1], 'generation')
if not gen or tonumber(gen) > tonumber(ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
