-- host-heartbeat: a registered session host says it is alive and how loaded it is.
--
-- KEYS[1] hosts              <prefix>hosts
-- ARGV[1] host id
-- ARGV[2] load
--
-- Returns the heartbeat time (ms, Redis clock), or 0 when the host is not registered (pruned as stale:
-- it must register again).

local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local host = cjson.decode(raw)
host.load = tonumber(ARGV[2])
host.heartbeatAt = now
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(host))
return now
