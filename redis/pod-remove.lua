-- pod-remove: forget a finished pod. Deletes its record, index entries and lease; the history stream
-- stays, with a TTL, so `status` can still tell what happened for a while.
--
-- KEYS[1] pod hash           <prefix>pod:<uid>
-- KEYS[2] pod index          <prefix>pods
-- KEYS[3] name index         <prefix>pods:by-name
-- KEYS[4] history            <prefix>hist:<uid>
-- KEYS[5] deadline index     <prefix>deadlines
-- KEYS[6] outbox index       <prefix>outbox
-- KEYS[7] review index       <prefix>review
-- KEYS[8] lease              <prefix>lease:<uid>
-- KEYS[9] lease index        <prefix>leases
-- ARGV[1] uid
-- ARGV[2] history TTL (seconds)
-- ARGV[3] expected gen, or '' to remove whatever is stored
--
-- Returns 1 when removed, 0 when there was no record (the rest is cleaned anyway), -1 on a gen conflict.

local gen = redis.call('HGET', KEYS[1], 'gen')
if gen and ARGV[3] ~= '' and gen ~= ARGV[3] then
  return -1
end

if gen then
  local names = redis.call('HMGET', KEYS[1], 'namespace', 'name')
  local nameKey = (names[1] or '') .. '/' .. (names[2] or '')
  if redis.call('HGET', KEYS[3], nameKey) == ARGV[1] then
    redis.call('HDEL', KEYS[3], nameKey)
  end
  redis.call('DEL', KEYS[1])
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('DEL', KEYS[8])
redis.call('ZREM', KEYS[9], ARGV[1])
redis.call('EXPIRE', KEYS[4], ARGV[2])
if gen then
  return 1
end
return 0
