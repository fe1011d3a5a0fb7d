package global

import "github.com/redis/go-redis/v9"

// scriptTime reads the limit's time into now (µs) and its newest bucket (or
// admission) into latest, from the hash named hash: the server clock plus
// an offset kept in the hash. A server clock behind latest by step or more
// (a failover to a replica whose clock is behind) moves the offset, so
// that the limit's time continues from latest instead of stalling for the
// size of the step; a smaller step is left to the clamp.
const scriptTime = `
local t = redis.call('TIME')
local raw = tonumber(t[1]) * 1000000 + tonumber(t[2])
local off = tonumber(redis.call('HGET', hash, 'off') or '0')
local now = raw + off
local latest = tonumber(redis.call('HGET', hash, 'latest') or '0')
if now < latest - step then
  off = latest - raw
  now = latest
  redis.call('HSET', hash, 'off', string.format('%.0f', off))
end
`

// scriptReplay answers a call that already ran with the answer it got: a
// client that retries after a reply was lost (go-redis retries a command
// whose connection failed, up to MaxRetries) must not be counted twice.
// The answer is kept under the call's own key (reply) for a few seconds.
const scriptReplay = `
local reply = KEYS[#KEYS]
local prev = redis.call('GET', reply)
if prev then
  local out = {}
  for v in string.gmatch(prev, '[^,]+') do out[#out + 1] = tonumber(v) end
  return out
end
`

// scriptAnswer records and returns the answer res (see scriptReplay).
const scriptAnswer = `
local parts = {}
for i, v in ipairs(res) do parts[i] = string.format('%.0f', v) end
redis.call('SET', reply, table.concat(parts, ','), 'PX', replyTTL)
return res
`

// scriptThreshold makes the smallest threshold that any instance asked
// with within the last window the one that applies, so that instances that
// disagree (a rolling change of a limit) never admit more than the smaller.
// An instance that stops asking stops counting after a window.
const scriptThreshold = `
local tmin = tonumber(redis.call('HGET', hash, 'tmin') or '-1')
local tminAt = tonumber(redis.call('HGET', hash, 'tmin_at') or '0')
if tmin < 0 or threshold <= tmin or now - tminAt >= window then
  redis.call('HSET', hash, 'tmin', string.format('%.0f', threshold), 'tmin_at', string.format('%.0f', now))
  tmin = threshold
end
threshold = math.min(threshold, tmin)
`

// scriptPresence reads the presence field f (value v, "expires,share,
// until") of an instance into reserved: its share counts while its presence
// has lapsed (it may be falling back, or cut off) for up to hold, and until
// a window after it came back (what it admitted meanwhile is not counted
// here); a presence lapsed longer than hold is forgotten. The scripts keep
// at most half the threshold for lapsed instances, so that instances that
// died without a word never close the limit.
const scriptPresence = `
local pe, ps, pu = string.match(v, '^(%d+),(%d+),(%d+)$')
if pe then
  pe, ps, pu = tonumber(pe), tonumber(ps), tonumber(pu)
  if now >= pe + hold then
    redis.call('HDEL', hash, f)
  elseif now >= pe or now < pu then
    reserved = reserved + ps
  end
end
`

// presenceScript renews an instance's presence in a limit's hash
// (KEYS[1]); ARGV: the instance's ID, its share (admissions per window it
// makes on its own while it falls back), the presence's TTL (µs), the
// window (µs), whether it may have fallen back since it last renewed (1 or
// 0), the least expiry of the hash (ms), the step tolerance (µs). An
// instance whose presence lapsed, or that may have fallen back, has its
// share kept from the others for a window from now (see scriptPresence).
var presenceScript = redis.NewScript(`
local hash = KEYS[1]
local f = 'p:' .. ARGV[1]
local share = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local rejoin = tonumber(ARGV[5])
local keep = tonumber(ARGV[6])
local step = tonumber(ARGV[7])
` + scriptTime + `
local untilT = 0
local prev = redis.call('HGET', hash, f)
if prev then
  local pe, ps, pu = string.match(prev, '^(%d+),(%d+),(%d+)$')
  if pe then
    untilT = tonumber(pu)
    if now >= tonumber(pe) then rejoin = 1 end
  end
end
if rejoin == 1 then untilT = math.max(untilT, now + window) end
redis.call('HSET', hash, f, string.format('%.0f,%.0f,%.0f', now + ttl, share, untilT))
if redis.call('PTTL', hash) < keep then redis.call('PEXPIRE', hash, keep) end
return 1
`)

// scriptExpire makes the hash live at least ttl (ms) more: presence may
// keep it longer.
const scriptExpire = `
if redis.call('PTTL', hash) < ttl then redis.call('PEXPIRE', hash, ttl) end
`

// windowScript is the bucketed sliding window. KEYS[1] is the limit's hash,
// KEYS[2] the call's reply key (see scriptReplay); ARGV: threshold per
// window, window (µs), buckets, want (what the waiting requests ask), max
// lease, TTL (ms), the step tolerance (µs), the reply's TTL (ms), need (the
// smallest request among want: less than that is refused), hold (µs; see
// scriptPresence), then pairs of a bucket's start (µs) and the tokens
// leased in it that this instance gives back unspent, or of "c" and an age
// (µs), ":" and a slot's name and the running total of what it admitted on
// its own that long ago (counted once, whatever the calls that send it).
// It grants what fits of want, at least need, plus a lease of up
// to max lease and a quarter of the room left. It returns granted (0:
// refused), the count in the window after the call, remaining, retry-after
// (µs, for need; -1: never), the limit's time (µs), the start and length of
// the bucket counted in (µs).
var windowScript = redis.NewScript(`
local hash = KEYS[1]
local threshold = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local buckets = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local maxLease = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local step = tonumber(ARGV[7])
local replyTTL = tonumber(ARGV[8])
local need = tonumber(ARGV[9])
local hold = tonumber(ARGV[10])
` + scriptReplay + scriptTime + `
local blen = math.floor(window / buckets)
-- The window is whole buckets: with an interval that buckets do not
-- divide, a little shorter than it.
window = blen * buckets
local cur = now - (now % blen)
-- A step back smaller than the tolerance: count in the newest bucket,
-- never in one the window has already passed.
if cur < latest then cur = latest end
-- ARGV 11 on, pairs: tokens this instance leased in an earlier bucket
-- (its start) and never spent, taken off that bucket while it is in the
-- window; or, for "c", an age (µs), ":" and a slot's name, the running
-- total of what the instance admitted on its own in that slot, that long
-- ago, while it fell back: what was not yet applied of it (kept in the
-- field "k:" and the name, with the bucket) is counted in the bucket of
-- then, if that is still in the window.
for i = 11, #ARGV - 1, 2 do
  local f = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  local age, slot = string.match(f, '^c(%d+):(.+)$')
  if age then
    local at = now - tonumber(age)
    local b = at - (at % blen)
    local kf = 'k:' .. slot
    local applied = tonumber(string.match(redis.call('HGET', hash, kf) or '0', '^(%d+)')) or 0
    if n > applied and cur - b < window then
      -- Never more than a threshold into one bucket at once.
      redis.call('HINCRBY', hash, string.format('%.0f', b), math.min(n - applied, threshold))
      redis.call('HSET', hash, kf, string.format('%.0f,%.0f', n, b))
    end
  else
    local had = tonumber(redis.call('HGET', hash, f) or '0')
    if had > 0 and n > 0 then
      redis.call('HINCRBY', hash, f, -math.min(had, n))
    end
  end
end
` + scriptThreshold + `
local total = 0
local reserved = 0
local live = {}
local kv = redis.call('HGETALL', hash)
for i = 1, #kv, 2 do
  local f = kv[i]
  local s = tonumber(f)
  if s then
    if cur - s >= window then
      redis.call('HDEL', hash, f)
    else
      local c = tonumber(kv[i + 1])
      total = total + c
      live[#live + 1] = {s, c}
    end
  elseif string.sub(f, 1, 2) == 'p:' then
    local v = kv[i + 1]
` + scriptPresence + `
  elseif string.sub(f, 1, 2) == 'k:' then
    -- What a carried slot applied: forgotten a bucket after its bucket
    -- left (no call places the slot in the window by then).
    local kb = tonumber(string.match(kv[i + 1], ',(%d+)$'))
    if not kb or cur - kb >= window + blen then redis.call('HDEL', hash, f) end
  end
end
threshold = threshold - math.min(reserved, math.floor(threshold / 2))
local granted = 0
local room = threshold - total
if need <= room then
  -- What fits of what the requests want, then a lease of up to a quarter
  -- of what is left.
  granted = math.max(need, math.min(want, room))
  granted = granted + math.max(0, math.min(maxLease, math.floor((room - granted) / 4)))
  redis.call('HINCRBY', hash, string.format('%.0f', cur), granted)
  total = total + granted
end
if cur > latest then
  redis.call('HSET', hash, 'latest', string.format('%.0f', cur))
end
` + scriptExpire + `
local retry = 0
if granted == 0 then
  retry = -1
  if need <= threshold and total + need > threshold then
    table.sort(live, function(a, b) return a[1] < b[1] end)
    local over = total + need - threshold
    local freed = 0
    for _, sc in ipairs(live) do
      freed = freed + sc[2]
      if freed >= over then
        retry = math.max(0, sc[1] + window - now)
        break
      end
    end
  end
end
local res = {granted, total, threshold - total, retry, now, cur, blen}
` + scriptAnswer)

// logScript is the exact sliding log. KEYS[1] is the sorted set, KEYS[2]
// the meta hash, KEYS[3] the call's reply key; ARGV: threshold, window
// (µs), want, TTL (ms), the step tolerance (µs), the reply's TTL (ms),
// need, hold (µs; see scriptPresence), then pairs of "c", an age (µs),
// ":" and a slot's name, and a running total: what this instance admitted
// on its own that long ago while it fell back, logged then (what was not
// yet) if that is still in the window. It admits
// what fits of want, at least need, and returns what windowScript does,
// with the bucket being the whole window.
var logScript = redis.NewScript(`
local hash = KEYS[2]
local threshold = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local step = tonumber(ARGV[5])
local replyTTL = tonumber(ARGV[6])
local need = tonumber(ARGV[7])
local hold = tonumber(ARGV[8])
` + scriptReplay + scriptTime + `
if now < latest then now = latest end
` + scriptThreshold + `
local reserved = 0
local kv = redis.call('HGETALL', hash)
for i = 1, #kv, 2 do
  local f = kv[i]
  if string.sub(f, 1, 2) == 'p:' then
    local v = kv[i + 1]
` + scriptPresence + `
  elseif string.sub(f, 1, 2) == 'k:' then
    local ka = tonumber(string.match(kv[i + 1], ',(%d+)$'))
    if not ka or ka <= now - 2 * window then redis.call('HDEL', hash, f) end
  end
end
threshold = threshold - math.min(reserved, math.floor(threshold / 2))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - window))
for i = 9, #ARGV - 1, 2 do
  local age, slot = string.match(ARGV[i], '^c(%d+):(.+)$')
  local at = now - tonumber(age)
  local kf = 'k:' .. slot
  local applied = tonumber(string.match(redis.call('HGET', hash, kf) or '0', '^(%d+)')) or 0
  local n = tonumber(ARGV[i + 1])
  if n > applied and at > now - window then
    for j = 1, math.min(n - applied, threshold) do
      local seq = redis.call('HINCRBY', hash, 'seq', 1)
      redis.call('ZADD', KEYS[1], at, string.format('%.0f-%d', at, seq))
    end
    redis.call('HSET', hash, kf, string.format('%.0f,%.0f', n, at))
  end
end
local total = redis.call('ZCARD', KEYS[1])
local granted = 0
if total + need <= threshold then
  granted = math.min(want, threshold - total)
  for i = 1, granted do
    local seq = redis.call('HINCRBY', hash, 'seq', 1)
    redis.call('ZADD', KEYS[1], now, string.format('%.0f-%d', now, seq))
  end
  total = total + granted
end
redis.call('HSET', hash, 'latest', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ttl)
` + scriptExpire + `
local retry = 0
if granted == 0 and total + need <= threshold then
  retry = 0 -- nothing asked (a probe): room
elseif granted == 0 then
  retry = -1
  if need <= threshold then
    local over = total + need - threshold
    local oldest = redis.call('ZRANGE', KEYS[1], over - 1, over - 1, 'WITHSCORES')
    if #oldest == 2 then retry = math.max(0, tonumber(oldest[2]) + window - now) end
  end
end
local res = {granted, total, threshold - total, retry, now, now, window}
` + scriptAnswer)

// gcraScript is a Global GCRA rule's bucket (the generic cell rate
// algorithm on the server clock). KEYS[1] holds the theoretical arrival
// time of the next request (TAT): a string of decimal digits, nanoseconds
// since the epoch. ARGV: the interval (ns a token costs), the tolerance
// (ns: Burst x interval), n (0: a probe, which takes nothing).
//
// Exactness: Lua numbers are doubles, exact for integers up to 2^53. The
// script never forms an absolute time in nanoseconds (about 1.8e18, far
// past 2^53): it reads TIME as microseconds (1.8e15, exact until the year
// 2255), splits the stored TAT into its microseconds and its last three
// digits, and works in nanoseconds only on how far the TAT is ahead of
// now, which is at most the tolerance plus a request's cost, each at most
// 30 days (2.6e15 ns; flow refuses a Global GCRA rule whose bucket takes
// longer to refill): every sum and product stays an exact integer.
//
// A TAT further ahead than the tolerance (the server clock stepped back)
// is read as the tolerance: the bucket is empty, never fuller than it
// was, and a step back stalls it for one refill at most. It grants n when
// the TAT, moved on by n intervals, is at most the tolerance ahead of now,
// and then stores it with an expiry of when the bucket is full again (an
// absent key is a full bucket). It returns allowed (1 or 0), the tokens
// left, the retry-after (ns until n tokens are back; 0 when allowed, -1
// when n is more than the bucket holds), the reset (ns until the bucket
// is full) and the server time (µs).
//
// Unlike the window scripts it keeps no answer per call ID (that cost a
// quarter of the call): a call that go-redis retries after its reply was
// lost may take its tokens twice, which makes the bucket stricter by n,
// never looser.
var gcraScript = redis.NewScript(`
local interval = tonumber(ARGV[1])
local tol = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ahead = 0
local tat = redis.call('GET', KEYS[1])
if tat and #tat > 3 then
  local us = tonumber(string.sub(tat, 1, -4))
  local ns = tonumber(string.sub(tat, -3))
  if us and ns and us >= now then
    if us - now > tol / 1000 then
      ahead = tol
    else
      ahead = math.min((us - now) * 1000 + ns, tol)
    end
  end
end
local cost = n * interval
local allowed = 0
local retry = 0
if cost > tol then
  retry = -1
elseif ahead + cost > tol then
  retry = ahead + cost - tol
else
  allowed = 1
  if n > 0 then
    ahead = ahead + cost
    local at = now + math.floor(ahead / 1000)
    redis.call('SET', KEYS[1], string.format('%.0f%03d', at, ahead % 1000), 'PX', math.floor(ahead / 1000000) + 1)
  end
end
return {allowed, math.floor((tol - ahead) / interval), retry, ahead, now}
`)
