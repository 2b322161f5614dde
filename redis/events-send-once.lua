-- events-send-once: adds an event to the stream unless one with the same id still waits (the watch sends
-- the same pod state again on a resync or a restart). The id's key is removed when the event is applied
-- (EventConsumer), so a later change is sent; its TTL only bounds a key whose event was lost.
--
-- KEYS[1] events stream       <prefix>events
-- KEYS[2] once key            <prefix>events:once:<id>
-- ARGV[1] uid
-- ARGV[2] event (JSON)
-- ARGV[3] the id
-- ARGV[4] the key's TTL (ms)
--
-- Returns the entry's id, or false when an event with this id still waits.

if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[4]) then
  return false
end
return redis.call('XADD', KEYS[1], '*', 'uid', ARGV[1], 'event', ARGV[2], 'once', ARGV[3])
