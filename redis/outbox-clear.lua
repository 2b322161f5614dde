-- outbox-clear: the effects written with gen `ARGV[2]` have run: clear them, unless a later write has
-- replaced them (its own effects are its writer's to run and clear).
--
-- KEYS[1] pod hash           <prefix>pod:<uid>
-- KEYS[2] outbox index       <prefix>outbox
-- ARGV[1] uid
-- ARGV[2] gen the effects were written with
--
-- Returns 1 when cleared, 0 when the record has moved on (or is gone).

if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], 'outbox')
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
