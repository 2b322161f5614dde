-- review-set: when the control plane should look at a pod again (the review index), set by the one who
-- just looked, only if the pod is still as it was read.
--
-- KEYS[1] pod hash           <prefix>pod:<uid>
-- KEYS[2] review index       <prefix>review        sorted set: uid scored by when to look at it again (ms)
-- ARGV[1] uid
-- ARGV[2] gen the looker read
-- ARGV[3] when (ms), or '' for not until a new state says so
--
-- Returns 1 when set, 0 when the pod is gone (its entry is dropped) or was written since (its new state
-- set its own time, which stands).

local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if gen ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
end
return 1
