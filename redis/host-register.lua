-- host-register: announce a session host (or announce it again after a restart).
--
-- KEYS[1] hosts              <prefix>hosts   hash: host id -> JSON {id, capacity, load, meta, startedAt, heartbeatAt}
-- ARGV[1] host id
-- ARGV[2] capacity (shadows it can hold)
-- ARGV[3] load (shadows it holds)
-- ARGV[4] meta (JSON object)
--
-- Returns the registration time (ms, Redis clock).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({
  id = ARGV[1],
  capacity = tonumber(ARGV[2]),
  load = tonumber(ARGV[3]),
  meta = cjson.decode(ARGV[4]),
  startedAt = now,
  heartbeatAt = now,
}))
return now
