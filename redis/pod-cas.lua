-- pod-cas: compare-and-set of a pod's snapshot. Writes only if the stored gen is the one the caller
-- loaded, so concurrent appliers never lose an update: the loser reloads and applies again.
--
-- KEYS[1] pod hash           <prefix>pod:<uid>
-- KEYS[2] pod index          <prefix>pods          sorted set: uid scored by updatedAt (ms)
-- KEYS[3] name index         <prefix>pods:by-name  hash: "<namespace>/<name>" -> uid
-- KEYS[4] history            <prefix>hist:<uid>    stream, capped
-- KEYS[5] deadline index     <prefix>deadlines     sorted set: uid scored by its deadline (ms)
-- KEYS[6] outbox index       <prefix>outbox        sorted set: uid scored by when its effects were written
-- KEYS[7] review index       <prefix>review        sorted set: uid scored by when to look at it again (ms)
-- ARGV[1] uid
-- ARGV[2] expected gen (as loaded)
-- ARGV[3] snapshot (JSON)
-- ARGV[4] machine version
-- ARGV[5] state name
-- ARGV[6] namespace
-- ARGV[7] name
-- ARGV[8] deadline (ms) the new state holds, or '' for none
-- ARGV[9] effects the transition asked for (JSON), or '' for none
-- ARGV[10] look at the pod again this many ms from now (the review index), or '' for not at all
-- ARGV[11] history cap (XADD MAXLEN ~)
-- ARGV[12] the session plan the transition's render made (JSON), or '' for none: kept beside the snapshot,
--          read only by a launch, so no other transition loads or stores it
-- ARGV[13..] history entry as field, value, … (none: no entry)
--
-- Returns {1, new gen} when written, {0, stored gen} on a conflict, {-1, 0} when the pod has no record.
--
-- It runs for every transition of every pod, so it touches only what changes: one HMGET reads what it
-- compares, the name index is written only when the name changes, and an index entry is removed only
-- when the record says it has one (`deadlineAt` is '' when it has none).

local cur = redis.call('HMGET', KEYS[1], 'gen', 'namespace', 'name', 'outbox', 'deadlineAt')
local gen = cur[1]
if not gen then
  return {-1, 0}
end
if gen ~= ARGV[2] then
  return {0, tonumber(gen)}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nextGen = tonumber(gen) + 1
local fields = {'snapshot', ARGV[3], 'version', ARGV[4], 'gen', nextGen, 'state', ARGV[5], 'updatedAt', now,
  'deadlineAt', ARGV[8]}

-- The pod may have been renamed in the record (POD_UPSERT): move its name index entry.
local oldKey = (cur[2] or '') .. '/' .. (cur[3] or '')
local newKey = ARGV[6] .. '/' .. ARGV[7]
if oldKey ~= newKey then
  if redis.call('HGET', KEYS[3], oldKey) == ARGV[1] then
    redis.call('HDEL', KEYS[3], oldKey)
  end
  redis.call('HSET', KEYS[3], newKey, ARGV[1])
  table.insert(fields, 'namespace')
  table.insert(fields, ARGV[6])
  table.insert(fields, 'name')
  table.insert(fields, ARGV[7])
end

-- The deadline is indexed with the state that holds it, so it can be neither lost nor left behind.
if ARGV[8] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[8], ARGV[1])
elseif cur[5] ~= '' then
  redis.call('ZREM', KEYS[5], ARGV[1])
end
-- The effects go into the outbox with the state that asked for them: a worker that dies before running
-- them leaves them there for another (outbox-claim), instead of losing them.
if ARGV[9] ~= '' then
  table.insert(fields, 'outbox')
  table.insert(fields, ARGV[9])
  redis.call('ZADD', KEYS[6], now, ARGV[1])
elseif cur[4] then
  redis.call('HDEL', KEYS[1], 'outbox')
  redis.call('ZREM', KEYS[6], ARGV[1])
end
if ARGV[12] ~= '' then
  table.insert(fields, 'plan')
  table.insert(fields, ARGV[12])
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], now, ARGV[1])
-- When to look at the pod again is a property of the state it is in: set with it, never left behind.
if ARGV[10] == '' then
  redis.call('ZREM', KEYS[7], ARGV[1])
else
  redis.call('ZADD', KEYS[7], now + tonumber(ARGV[10]), ARGV[1])
end
if #ARGV > 12 then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[11], '*', unpack(ARGV, 13))
end
return {1, nextGen}
