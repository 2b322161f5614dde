-- pod-create: store a pod's first snapshot, only if the pod has no record yet.
--
-- KEYS[1] pod hash           <prefix>pod:<uid>     {snapshot, version, gen, state, updatedAt, namespace, name}
-- KEYS[2] pod index          <prefix>pods          sorted set: uid scored by updatedAt (ms)
-- KEYS[3] name index         <prefix>pods:by-name  hash: "<namespace>/<name>" -> uid
-- KEYS[4] history            <prefix>hist:<uid>    stream, capped
-- KEYS[5] deadline index     <prefix>deadlines     sorted set: uid scored by its deadline (ms)
-- KEYS[6] outbox index       <prefix>outbox        sorted set: uid scored by when its effects were written
-- KEYS[7] review index       <prefix>review        sorted set: uid scored by when to look at it again (ms)
-- ARGV[1] uid
-- ARGV[2] snapshot (JSON)
-- ARGV[3] machine version
-- ARGV[4] state name
-- ARGV[5] namespace
-- ARGV[6] name
-- ARGV[7] deadline (ms) the first state holds, or '' for none
-- ARGV[8] effects the first state asked for (JSON), or '' for none
-- ARGV[9] the time (ms) of the event creating the record, or '' not to check: a pod whose history ends
--         in `done` at or after it is not created again (the event was older than the pod's end)
-- ARGV[10] look at the pod again this many ms from now (the review index), or '' for not at all
-- ARGV[11] history cap (XADD MAXLEN ~)
-- ARGV[12..] history entry as field, value, field, value … (none: no entry)
--
-- Returns 1 when created (gen is 1), 0 when the pod already had a record, -1 when the pod finished at or
-- after the event's time (nothing written either way).

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if ARGV[9] ~= '' then
  local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
  if #last > 0 then
    local fields, to, at = last[1][2], nil, nil
    for i = 1, #fields, 2 do
      if fields[i] == 'to' then to = fields[i + 1] elseif fields[i] == 'at' then at = tonumber(fields[i + 1]) end
    end
    if to == 'done' and at ~= nil and at >= tonumber(ARGV[9]) then
      return -1
    end
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('HSET', KEYS[1],
  'snapshot', ARGV[2], 'version', ARGV[3], 'gen', 1, 'state', ARGV[4],
  'updatedAt', now, 'namespace', ARGV[5], 'name', ARGV[6], 'deadlineAt', ARGV[7])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[5] .. '/' .. ARGV[6], ARGV[1])
if ARGV[7] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[7], ARGV[1])
end
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], 'outbox', ARGV[8])
  redis.call('ZADD', KEYS[6], now, ARGV[1])
end
if ARGV[10] ~= '' then
  redis.call('ZADD', KEYS[7], now + tonumber(ARGV[10]), ARGV[1])
end

-- A history left behind by an earlier record of this uid (it only had a TTL) continues, kept again.
redis.call('PERSIST', KEYS[4])
if #ARGV > 11 then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[11], '*', unpack(ARGV, 12))
end
return 1
