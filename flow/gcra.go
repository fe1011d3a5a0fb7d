package flow

import "github.com/leapflow/leapflow/internal/gcra"

// gcraRule is a GCRA rule in a rule set: a limiter on its bucket (which
// is kept across reloads; see package gcra). The limiter comes first, so
// take passes the rule's own pointer on.
type gcraRule struct {
	l  gcra.Limiter
	be *BlockError
}

// newGCRARule is r's rule on bucket c: Threshold 0 refuses everything.
func newGCRARule(c *gcra.Cell, r *Rule) gcraRule {
	return gcraRule{l: gcra.New(c, r.Threshold, int64(r.Burst)), be: newBlockError(r, ReasonFlow)}
}

// take takes n tokens at now if they are there within maxWait, and
// returns how long the caller waits for them and the arrival time it set
// (its token for give); refused, it reports when they would be there (the
// wait, -1 when never: more than Burst) and how long until the bucket is
// full again.
func (r *gcraRule) take(now, n, maxWait int64) (wait, tok int64, ok bool, rm room) {
	wait, tok, ok, rm.retry, rm.reset = r.l.Take(now, n, maxWait)
	return
}

// give gives back n tokens that take took, setting arrival time tok, if
// no request has taken tokens since (see gcra.Limiter.Give).
func (r *gcraRule) give(n, tok int64) { r.l.Give(n, tok) }
