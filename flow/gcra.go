package flow

import "github.com/leapflow/leapflow/internal/gcra"

// gcraRule is a GCRA rule in a rule set: its bucket (kept across reloads
// that keep the rule) and its rate and burst (see package gcra).
type gcraRule struct {
	c  *gcra.Cell
	l  gcra.Limit
	be *BlockError
}

// newGCRARule is r's rule on bucket c: Threshold 0 refuses everything.
func newGCRARule(c *gcra.Cell, r *Rule) gcraRule {
	return gcraRule{c: c, l: gcra.NewLimit(r.Threshold, int64(r.Burst)), be: newBlockError(r, ReasonFlow)}
}

// take takes n tokens at now if they are there within maxWait, and
// returns how long the caller waits for them and the arrival time it set
// (its token for give); refused, it reports when they would be there (the
// wait, -1 when never: more than Burst) and how long until the bucket is
// full again.
func (r *gcraRule) take(now, n, maxWait int64) (wait, tok int64, ok bool, rm room) {
	wait, tok, ok, rm.retry, rm.reset = r.l.Take(r.c, now, n, maxWait)
	return
}

// give gives back n tokens that take took, setting arrival time tok, if
// no request has taken tokens since (see gcra.Limit.Give).
func (r *gcraRule) give(n, tok int64) { r.l.Give(r.c, n, tok) }
