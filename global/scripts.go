package global

import "github.com/redis/go-redis/v9"

// windowScript is the bucketed sliding window. KEYS[1] is the limit's hash;
// ARGV: threshold per window, window (µs), buckets, want (the request's
// count), max lease, TTL (ms). It returns granted (0: refused), the count
// in the window after the call, remaining, retry-after (µs; -1: never),
// server time (µs), the start and length of the bucket counted in (µs).
var windowScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local threshold = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local buckets = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local maxLease = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local blen = math.floor(window / buckets)
local cur = now - (now % blen)
-- Server time may go back after a failover: count in the newest bucket,
-- never in one the window has already passed.
local latest = tonumber(redis.call('HGET', KEYS[1], 'latest') or '0')
if cur < latest then cur = latest end
local total = 0
local live = {}
local kv = redis.call('HGETALL', KEYS[1])
for i = 1, #kv, 2 do
  if kv[i] ~= 'latest' then
    local s = tonumber(kv[i])
    if cur - s >= window then
      redis.call('HDEL', KEYS[1], kv[i])
    else
      local c = tonumber(kv[i + 1])
      total = total + c
      live[#live + 1] = {s, c}
    end
  end
end
local granted = 0
local room = threshold - total
if want <= room then
  granted = math.max(want, math.min(maxLease, math.floor(room / 4)))
  redis.call('HINCRBY', KEYS[1], string.format('%.0f', cur), granted)
  total = total + granted
end
if cur > latest then
  redis.call('HSET', KEYS[1], 'latest', string.format('%.0f', cur))
end
redis.call('PEXPIRE', KEYS[1], ttl)
local retry = 0
if granted == 0 then
  retry = -1
  if want <= threshold then
    table.sort(live, function(a, b) return a[1] < b[1] end)
    local need = total + want - threshold
    local freed = 0
    for _, sc in ipairs(live) do
      freed = freed + sc[2]
      if freed >= need then
        retry = math.max(0, sc[1] + window - now)
        break
      end
    end
  end
end
return {granted, total, threshold - total, retry, now, cur, blen}
`)

// logScript is the exact sliding log. KEYS[1] is the sorted set, KEYS[2]
// the meta hash; ARGV: threshold, window (µs), want, TTL (ms). It returns
// what windowScript does, with the bucket being the whole window.
var logScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local threshold = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local latest = tonumber(redis.call('HGET', KEYS[2], 'latest') or '0')
if now < latest then now = latest end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - window))
local total = redis.call('ZCARD', KEYS[1])
local granted = 0
if total + want <= threshold then
  for i = 1, want do
    local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
    redis.call('ZADD', KEYS[1], now, string.format('%.0f-%d', now, seq))
  end
  granted = want
  total = total + want
end
redis.call('HSET', KEYS[2], 'latest', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
local retry = 0
if granted == 0 then
  retry = -1
  if want <= threshold then
    local need = total + want - threshold
    local oldest = redis.call('ZRANGE', KEYS[1], need - 1, need - 1, 'WITHSCORES')
    if #oldest == 2 then retry = math.max(0, tonumber(oldest[2]) + window - now) end
  end
end
return {granted, total, threshold - total, retry, now, now, window}
`)
