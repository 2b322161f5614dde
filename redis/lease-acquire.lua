-- lease-acquire: take a pod's fencing lease for a shadow session (ARCHITECTURE.md §3.7).
-- Granted when the lease is free, expired, or already held by the same holder; never to a generation
-- older than the one holding it (a stale shadow must not come back). Every grant draws a new fencing
-- token from a counter, so an earlier holder's token stops working at once. The counter is first raised
-- to the server's clock in microseconds: a failover that lost the last grants (replication is
-- asynchronous) rolls the counter back, and a plain INCR would then hand a lost grant's token to the
-- next holder, whose lease the lost one's session could go on renewing.
-- While the fleet recovers from a Redis that lost its data (redis/epoch-check.lua), a lease that is free
-- is granted only to a holder re-asserting one it held before the loss: a pod record rebuilt from the API
-- server launches a shadow at once, and a second session host must not take a pod whose live shadow's
-- host has yet to notice. A re-asserted lease is marked so: another host given that pod's session job at
-- the same generation knows the shadow lives on and stands down (reason 'reasserted').
--
-- KEYS[1] lease              <prefix>lease:<uid>     hash {holder, generation, token, expiresAt}
-- KEYS[2] lease index        <prefix>leases          sorted set: uid scored by expiresAt (ms)
-- KEYS[3] token counter      <prefix>lease-token
-- KEYS[4] epoch              <prefix>epoch           hash {id, since, recoverUntil}
-- ARGV[1] uid
-- ARGV[2] holder (session host id)
-- ARGV[3] generation
-- ARGV[4] ttl (ms)
-- ARGV[5] retain (ms): the key outlives expiresAt by this much, so the reaper can see expired leases
-- ARGV[6] '1' when re-asserting a lease held before Redis lost its data, else '0'
--
-- Returns {1, holder, generation, token, expiresAt} when granted,
--         {0, holder, generation, token, expiresAt, reason} with the current lease when refused
--         (reason 'held', 'reasserted' (held, re-asserted after a loss), 'older-generation' or
--         'recovering' (free, but the recovery window is open: no holder then)).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local generation = tonumber(ARGV[3])

local reassert = ARGV[6] == '1'
local cur = redis.call('HMGET', KEYS[1], 'holder', 'generation', 'token', 'expiresAt', 'reasserted')
if cur[1] then
  local curGen = tonumber(cur[2])
  local refused = nil
  if generation < curGen then
    refused = 'older-generation'
  elseif cur[1] ~= ARGV[2] and tonumber(cur[4]) > now then
    refused = cur[5] == '1' and 'reasserted' or 'held'
  end
  if refused then
    return {0, cur[1], curGen, tonumber(cur[3]), tonumber(cur[4]), refused}
  end
elseif not reassert then
  local recoverUntil = tonumber(redis.call('HGET', KEYS[4], 'recoverUntil') or '0')
  if now < recoverUntil then
    return {0, '', 0, 0, recoverUntil, 'recovering'}
  end
end

local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = math.max(tonumber(redis.call('GET', KEYS[3]) or '0'), floor) + 1
redis.call('SET', KEYS[3], string.format('%.0f', token))
local expiresAt = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'holder', ARGV[2], 'generation', generation, 'token', token, 'expiresAt', expiresAt,
  'reasserted', reassert and '1' or '0')
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) + tonumber(ARGV[5]))
redis.call('ZADD', KEYS[2], expiresAt, ARGV[1])
return {1, ARGV[2], generation, token, expiresAt}
