// Package global enforces flow rules across instances on Redis: the only
// package of leapflow that imports a Redis client.
//
// A Source is a flow.TokenSource. Each global rule is a bucketed sliding
// window — the shape of the local engine's — kept in one Redis hash and
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
// whose instances disagree on the layout (Options.Buckets, or thresholds on
// both sides of Options.ExactBelow) splits into one limit per layout, and a
// rolling upgrade that changes the schema version splits it into two until
// it completes: each side enforces the full threshold.
//
// # Leasing
//
// A busy instance does not pay a round trip per request: it takes tokens in
// batches (at most Options.MaxBatch, and at most a quarter of the room left,
// shrinking to the request itself near the limit). The script counts a
// batch in the server bucket current when it ran; the instance spends it
// only until that bucket ends, by its own clock, starting from the moment it
// sent the request (so the round trip only shortens the lease). Unused
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
// threshold is admitted whole (tested at 0.9 of it; 1 and 4 instances
// measured).
//
// The bound: every admission is counted, at the moment the script granted
// it, in a server bucket, and every server window (n consecutive buckets) of
// a limit counts at most its threshold, whatever the number of instances.
// Tokens leased and not yet spent or given back make their window
// stricter: at most the leases of the current bucket per instance, and for
// an instance that stops calling (given back only by its next call), its
// last leases, for one window. A server that restarts without persistence forgets
// its windows: for one window the limit can be exceeded by what was
// admitted before the restart. Likewise a failover to a replica (Redis
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
// Every call has a short timeout (Options.Timeout; the client must honour
// context deadlines, as with go-redis' ContextTimeoutEnabled, or have read
// and write timeouts as short). When Redis fails, Acquire returns an error
// and flow applies the rule's fallback (a local share of the threshold,
// open, or closed) and counts it in the resource's statistics. After a
// failure the Source stops calling Redis for a backoff that doubles up to
// Options.MaxBackoff, then lets one call probe it; the first success ends
// the backoff.
//
// # Exact mode
//
// Limits whose threshold per window is at most Options.ExactBelow use a
// sliding log instead: a sorted set of admissions with unique members,
// exact in every continuous span, at one round trip and one set member per
// admission.
package global
