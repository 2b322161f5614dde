-- lease-prune: drop a lease index entry whose lease key is gone (its TTL ran out).
--
-- KEYS[1] lease              <prefix>lease:<uid>
-- KEYS[2] lease index        <prefix>leases
-- ARGV[1] uid
--
-- Returns 1 when the entry was dropped, 0 when the lease still exists.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
return redis.call('ZREM', KEYS[2], ARGV[1])
