-- epoch-check: tell whether Redis lost what it held since this process last looked (ARCHITECTURE.md §3.8).
-- The fleet keeps one small hash that nothing deletes: a Redis restarted empty (no AOF, a pod rescheduled
-- without its volume, a replica promoted before it had a copy) has lost it with everything else. A process
-- that knew an id and finds none, or another, knows that its leases, its host registration and the pods'
-- records are gone, and that it must re-assert what it holds. The first to find it gone writes a new id and
-- opens a recovery window: until recoverUntil no lease is granted except to a holder re-asserting one
-- (lease-acquire), so a rebuilt pod record cannot hand a live shadow's pod to a second session host.
--
-- KEYS[1] epoch   <prefix>epoch   hash {id, since, recoverUntil}
-- ARGV[1] the id this process knows ('' when it has not looked before: nothing can have been lost to it)
-- ARGV[2] a new id, used when there is none
-- ARGV[3] recovery window (ms)
--
-- Returns {id, lost (1/0), recoverUntil (ms, 0 when none)}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local known = ARGV[1]

local id = redis.call('HGET', KEYS[1], 'id')
if not id then
  id = ARGV[2]
  redis.call('HSET', KEYS[1], 'id', id, 'since', now)
end
if known == '' or known == id then
  return {id, 0, tonumber(redis.call('HGET', KEYS[1], 'recoverUntil') or '0')}
end

-- Lost: every holder that finds it so extends the window, so the last to look still gets its turn.
local recoverUntil = math.max(tonumber(redis.call('HGET', KEYS[1], 'recoverUntil') or '0'), now + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'recoverUntil', recoverUntil)
return {id, 1, recoverUntil}
