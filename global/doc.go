// Package global enforces flow rules across instances on Redis: the only
// package of leapflow that imports a Redis client.
//
// A Source is a flow.TokenSource. Each global rule (but a GCRA rule: see
// below) is a bucketed sliding window — the shape of the local engine's —
// kept in one Redis hash and
// updated by one Lua script that reads the server clock (TIME), drops stale
// buckets, checks and counts in one atomic step, refreshes the key's expiry
// and returns allowed, count, remaining, retry-after and server time.
// Server time going backwards neither opens the gate nor stalls it: a step
// back of 100 ms or more (a failover to a replica whose clock is behind)
// goes into an offset kept with the limit, so the limit's time continues
// from its newest bucket; a smaller one counts in the newest bucket, as
// leaparray does. Scripts run by EVALSHA and are reloaded on NOSCRIPT
// (after a restart, a failover or SCRIPT FLUSH). Every call carries an ID
// (the instance's and a sequence number), and the script keeps its answer
// under it for a few seconds: a call that go-redis retries after its reply
// was lost (the client's MaxRetries) gets the first answer and is counted
// once.
//
// # Keys
//
// A limit's keys are the prefix, the limit's identity in a hash tag (the
// rule's ID, or its resource, each in a name space of its own:
// "leapflow:{id:checkout-api}:..." and "leapflow:{resource:api}:..."), a
// schema version and the layout of its data (interval, and buckets or
// "log"). All keys of a limit share the hash tag, so a limit lives in one
// slot of a Redis Cluster; a prefix may not contain braces. The threshold is
// not in the key but an argument of every decision: instances that disagree
// on it (a rolling change of the rule) share the limit, and the smallest
// threshold any instance asked with within the last window applies. A limit
// whose instances disagree on the layout (WithBuckets, or thresholds on
// both sides of WithExactBelow) splits into one limit per layout, and a
// rolling upgrade that changes the schema version splits it into two until
// it completes: each side enforces the full threshold.
//
// # Leasing
//
// A busy instance does not pay a round trip per request: it takes tokens in
// batches (at most WithMaxBatch, and at most a quarter of the room left,
// shrinking to the request itself near the limit). The script counts a
// batch in the server bucket current when it ran; the instance spends it
// only until that bucket ends, by its own clock, taking the server to have
// read its clock halfway through the round trip (so a lease is spent no
// later than a direct answer counted at the end of the bucket would
// arrive; with paths as fast each way, not after the bucket ends). Unused
// tokens are never counted as passes locally and expire with their bucket;
// the instance's next call gives them back to that bucket if it is still in
// the window (the script takes them off its count), so they do not crowd
// out the rest of the window; so do tokens of a lease replaced by one of a
// later bucket, and tokens granted in a bucket's last moments, too late to
// spend. A lease is topped up within its bucket only in its last quarter,
// and only when, spent at the pace it has been, it would run out before the
// bucket ends; the batch doubles when that happens and halves when a bucket
// ends with more than half of one unspent. A request whose P has no lease
// takes from another P's before asking Redis. Evenly paced load up to the
// threshold is admitted whole (tested at 0.9 of it), and random arrivals
// (Poisson, bursty, one hot instance; 1 to 16 instances) are admitted as
// the same window run in one place would admit them (tested against that
// oracle; the bench reports the ratios).
//
// # Calls
//
// A limit has at most one call to Redis in flight from an instance, and no
// request waits on a lock. A request that finds no lease joins the limit's
// next call: the one in flight if it has not left yet, else the one that
// leaves as soon as it is answered. A call asks for what every request
// that joined it asks (Redis grants what fits, at least the smallest
// request), plus a lease of up to a quarter of what is left; the requests
// gathering for the next call take from that lease, or from tokens that
// came too late to lease, and then need no round trip. A refusal closes
// the window locally, until its retry-after, only to requests as large as
// the one refused; a request larger than the threshold is refused without
// a call.
// With MaxBatch 1 a call asks only for its requests, so concurrent requests
// still share round trips. A request waits at most WithTimeout (100 ms)
// for an answer; the call itself runs in the background for up to
// WithCallTimeout (1 s), so a late reply (a Redis far away, a new
// connection, a saturated CPU that runs the reading goroutine late) still
// installs its lease for the requests after and counts as a success; the
// requests that waited for it are refused as late. Replies later than
// Timeout most of the time therefore refuse most requests: raise Timeout
// above the round trip seen under load. A request still undecided at
// its deadline is refused and counted in Stats.Late, not failed over: a
// late reply is no evidence that Redis is down. The defaults are meant for
// a Redis up to 50 ms away (tested through a delaying proxy at 1, 20 and
// 50 ms round trip, the connections dropped midway); beyond that, raise
// Timeout to twice the round trip or more.
//
// The bound: every admission is counted, at the moment the script granted
// it, in a server bucket, and every server window (n consecutive buckets) of
// a limit counts at most its threshold, whatever the number of instances.
// A window is Buckets whole buckets of floor(interval/Buckets): with an
// interval they do not divide, a little shorter than the interval. A
// lease is spendable only in a bucket longer than ClockSlack and the round
// trip, so very short intervals (about 20 ms or less) cost a round trip
// per call.
//
// Tokens counted and not spent make their window stricter, never looser:
// per instance, the leases of the current bucket (each at most MaxBatch and
// a quarter of the room left when it was granted) until the next call
// gives them back, the tokens of requests that gave up waiting until the
// first call Timeout after, and, for an instance that stops calling, its
// last leases for one window. A server that restarts without persistence
// forgets its windows: for one window the limit can be exceeded by what
// Redis granted before the restart (what instances admitted on their own
// while it was down is carried into it: see Falling back on a local
// share). Likewise a failover to a replica (Redis
// Sentinel: pass a failover client, as redis.NewFailoverClient or a
// UniversalClient with MasterName makes) loses what the old master had not
// yet replicated, since Redis replicates asynchronously: the windows that
// span the failover may admit that much more, and until the sentinel turns
// the old master into a replica (about ten seconds after the switch) a
// client that has not heard of the switch can still be admitted there. The
// tests promote a replica under load: requests keep being answered and
// limiting resumes on it.
//
// # Failure
//
// A call fails when Redis answers with an error or not within CallTimeout
// (the client must honour context deadlines, as with go-redis'
// ContextTimeoutEnabled, or have read and write timeouts as short), or
// when its connection cannot be dialled. Every dial of the Source's client
// is tried once, its TCP connect bounded by Timeout (a TLS handshake by
// the client's DialTimeout, which Dial sets to the Timeout): New refuses a
// client whose DialerRetries is not 1 (go-redis' default, 5 attempts 100
// ms apart, held every call to a dead Redis for half a second and more), and
// a hook on the client makes a failed dial the failure of its command,
// which go-redis then neither retries (MaxRetries) nor counts towards the
// PoolSize failed dials after which it stops dialling for a second at a
// time. Dial builds a client that has all this. The requests waiting on a
// failed call get its error, and flow applies their
// rule's fallback (a local share of the threshold, open, or closed),
// counted in the resource's statistics. Health is kept per limit, so that
// in a Redis Cluster a failing node fails only the limits on its slots.
// After WithFailAfter calls of a limit in a row fail (2), the Source
// backs off that limit: it answers ErrUnavailable without calling Redis
// for WithBackoff (100 ms), then lets one call probe it.
// The backoff doubles only after FailAfter probes in a row fail slowly (a
// probe refused at once costs Redis nothing and does not double it), up
// to WithMaxBackoff (5 s); the first success ends it. A backoff ends on the
// first multiple of itself on the wall clock at least half of it away (so
// it lasts half to one and a half of it), so instances cut off together
// probe together and come back within moments of each other. So a Redis
// that refuses connections (killed) is detected within FailAfter calls,
// each one dial (FailAfter x Timeout at most; milliseconds on a network
// that answers), and found again within a Backoff of its return; one
// that stops answering is detected within FailAfter x CallTimeout (2 s),
// during which requests without a lease are refused as late (leases in
// hand are spent first). Once the Source backs off, requests fall back at
// once and never wait for a probe, which runs in the background; a dead
// Redis is probed at least every 1.5 x MaxBackoff. A request whose context ends
// while it waits is refused (flow applies no fallback to it). A call
// that fails after far longer than its CallTimeout (five quarters of it,
// on the Source's monotonic clock) ran while this process was paused
// (SIGSTOP, a frozen VM or container): it is not counted against Redis
// (Stats.Paused), and a backoff in force ends at once, so the process is
// back on Redis at its next request. The script is idempotent per call
// (see above), so go-redis' retries of a lost reply (MaxRetries) are safe
// and left on.
//
// # Falling back on a local share
//
// While some instances fall back on FallbackLocal, they admit their
// LocalShare of the threshold on their own, uncounted by Redis. So that
// the others do not fill the whole window on top of it, each instance
// renews its presence in the limits of its FallbackLocal rules every third
// of WithPresenceTTL (1 s) while Redis answers, and stops for a limit
// while it backs off. The scripts keep the share of every instance whose presence
// has lapsed from what the others are granted, for up to
// WithPresenceHold (10 s), and the share of an instance that may have
// fallen back for one window after it is back (what it admitted on its own
// is not in Redis). All lapsed instances together keep at most half the
// threshold: instances that died without a word (a crash, a rolling deploy
// that kills them) cannot close the limit, only halve it for PresenceHold.
// An instance that closes cleanly takes its presence away, and a closed
// Source refuses what its leases do not serve rather than fall back.
//
// An instance back on Redis carries what its fallback admitted on its own
// within the last window into the limit's window, each admission in the
// bucket of when it was made (flow tells the Source of each:
// flow.LocalCounter), so the others cannot admit it again; once a call has
// carried them, the instance's share is not kept from the others on
// rejoining (it is while some wait to be carried). Each bucket's admissions are sent as a
// running total, and the script keeps what it applied of each, so a call
// that ran although its reply was lost and the call that sends them again
// count them once. flow's local window of the rule also counts what Redis
// admits for this instance, so a fallback starts from what the instance
// admitted in the window, and after an outage (fallbacks no more than a
// bucket of the window or a second apart, over that long: not a failed
// call) it applies on top of Redis for a
// window or 5 s, whichever is shorter: an instance back before the others
// admits no more than its share while they may still admit theirs on
// their own. A Redis restarted empty (no persistence) knows
// nothing of the instances' presence or of what was admitted before it
// died: instances that come back within a window (or 5 s) of each other
// admit the threshold in all (measured with four processes, kill -9 and a
// restart: bench -only=global-outage); an instance still falling back
// later than that after the first came back adds its share on top, until
// it returns. Instances cut off together probe together (the backoff ends
// on the wall clock), so they come back within a Backoff of each other
// when their probes fail at once (a refused connection), and within their
// backoff, up to MaxBackoff, when they time out. The
// bound that remains: a server window can hold more than the threshold, by
// the shares of instances that began to fall back less than PresenceTTL
// before it (their presence had not lapsed yet) or have fallen back for
// longer than PresenceHold, and by what the shares of those falling back
// add up to beyond half the threshold; while instances are cut off, the
// others admit the threshold less their shares (tested: two of four
// instances cut off, all four together admit the threshold). A reload that
// drops a rule stops the renewal once the rule's bound source is
// collected.
//
// # Per-key rules
//
// A PerKey rule (flow.Rule.PerKey) is one limit per caller key, each with
// its own Redis hash: its key is "k", the rule key's length, the rule key,
// then "n" for requests without a key or "c:" and the caller's key, all in
// the hash tag (escaped), so that the keys of one rule spread over the
// slots of a Redis Cluster and no two callers, rules or rule and caller
// share a hash whatever bytes they hold. A key listed in the rule's Keys
// is asked with its own threshold. Each hash expires on its own once
// idle, as every limit's data does.
//
// In the Source a caller's limit is small (one lease slot, not one per P)
// and lives in a bounded cache (WithMaxKeys, default 100,000; otter's
// W-TinyLFU): an evicted caller's limit loses only its lease's unspent
// tokens (counted, never given back: stricter) and is made again when
// seen. It leases only once hot, after 4 calls to Redis in one window:
// a cold key costs one round trip per decision, the price of a limit
// shared across instances for a key seen now and then. The keys of a rule
// share one health per Redis master (in a Cluster, found from the
// client's slot map; elsewhere, the rule's), so an outage makes them all
// fall back together after FailAfter failed calls, while a failing master
// fails only the keys on its slots. Presence is not kept per key: a
// FallbackLocal per-key rule falls back per key, at LocalShare of the
// key's threshold, on a local per-key table, without keeping shares from
// the other instances.
//
// # GCRA rules
//
// A Global rule with Behavior GCRA (flow.Rule.Burst tokens refilled at
// Threshold per second) is one bucket shared by every instance: a single
// key holds the theoretical arrival time of the next request (the generic
// cell rate algorithm), "leapflow:{id:checkout-api}:v2/gcra", a shape no
// window limit has, so a GCRA rule and a window rule of the same ID are two
// limits and no key is read by both scripts. Each decision is one EVALSHA
// (an EVAL after a restart or SCRIPT FLUSH) of a script that reads the server clock (TIME), checks and moves the
// arrival time in one atomic step and sets the key to expire when the
// bucket is full again; so the bucket is exact across instances, whatever
// their clocks: in every span of length L of the server clock, all
// instances together admit at most Burst + Threshold x L (tested with four
// instances hammering one rule, on the server times the script returns).
// The script works in whole nanoseconds per token, as the local GCRA rule,
// without ever forming an absolute time in nanoseconds, which a Lua number
// (a double, exact to 2^53) cannot hold: it reads the clock in
// microseconds and keeps only how far the arrival time is ahead of now in
// nanoseconds, at most twice the bucket's refill time, which flow bounds
// to 30 days (2.6e15 ns). A server clock that steps back makes the bucket
// read as empty, never fuller, for one refill at most.
//
// There is no leasing: a bucket's tokens belong to no window that would
// expire them, so tokens held by one instance would be kept from the
// others for good. A request makes its one round trip itself (on a
// 2-core VM, handing it to another goroutine cost about as much as the
// script), waiting up to
// WithTimeout: a later reply refuses it as late, and a call apart,
// bounded by WithCallTimeout, then tells the limit's health whether
// Redis answers, so a dead or silent Redis trips the same backoff, probes
// and fallback as for window rules. The script keeps no answer per call:
// a call go-redis retries after its reply was lost may take its tokens
// twice (stricter by n, never looser). A refusal says when the tokens
// asked for are back (flow's Refusal.RetryAfter); until then requests as large are
// refused without a call, so an overloaded instance does not call Redis
// for every request it refuses; a batch larger than Burst is refused
// without one, and its retry is unknown. Admissions are never given back
// (a later rule of the resource that blocks the request does not return
// the tokens), as for window rules. Instances that disagree on the rate or
// burst (a rolling change) apply their own to the shared arrival time.
//
// Under FallbackLocal an instance cut off from Redis admits on a local
// bucket of LocalShare of the rate and of the burst (at least 1),
// uncounted by Redis: GCRA keeps no presence, so the others do not keep
// that share from what they admit, and the bucket can be exceeded by
// what the instances falling back admit (at most their shares' rate and
// bursts).
//
// # Exact mode
//
// Limits whose threshold per window is at most WithExactBelow use a
// sliding log instead: a sorted set of admissions with unique members,
// exact in every continuous span, at one round trip and one set member per
// admission.
//
// # Span-exact rules
//
// A span-exact rule (flow.Rule.SpanExact) is the window script counting
// Buckets+1 buckets of Interval/Buckets instead of Buckets, in a hash of
// its own (the key's shape ends in "+1"): a span of Interval meets at
// most Buckets+1 consecutive buckets, and every grant keeps every such
// sum within the threshold, so no span of Interval on the server's clock
// counts more than it, at the cost of a steady Buckets/(Buckets+1) of the
// threshold (91% with the default 10). Leasing is unchanged: a lease is
// spent within the server bucket it was counted in (as this instance
// estimates it from the reply), so what instances admit lands where the
// server counted it, give or take a round trip and the scheduling of the
// caller. A limit small enough for exact mode is a sliding log, exact in
// every span already.
package global
