-- events-trim: drops the entries of the events stream the consumer group is done with: all before the
-- oldest one still pending (delivered, not acknowledged), or, with none pending, all up to the last one
-- delivered. Entries not yet delivered are never dropped. Run now and then by any control worker.
--
-- KEYS[1] events stream       <prefix>events
-- ARGV[1] the consumer group
--
-- Returns how many entries were dropped.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local last
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #group, 2 do
    if group[i] == 'name' then
      name = group[i + 1]
    elseif group[i] == 'last-delivered-id' then
      delivered = group[i + 1]
    end
  end
  if name == ARGV[1] then
    last = delivered
  end
end
if not last then
  return 0
end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
local keep
if pending[1] > 0 then
  keep = pending[2]
else
  local ms, seq = string.match(last, '^(%d+)-(%d+)$')
  keep = ms .. '-' .. (tonumber(seq) + 1)
end
return redis.call('XTRIM', KEYS[1], 'MINID', keep)
