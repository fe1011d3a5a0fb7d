package flow

import (
	"math"

	"go.uber.org/atomic"
)

// gcra is a GCRA rule's state, kept across reloads that keep the rule: the
// theoretical arrival time (engine ns) of the next request at the
// sustained rate. The bucket is full when it is at or before now.
type gcra struct{ tat atomic.Int64 }

// gcraRule is a GCRA rule in a rule set: every token costs interval ns,
// and the bucket holds tolerance ns of them (Burst x interval).
type gcraRule struct {
	g                   *gcra
	interval, tolerance int64
	burst               int64
	off                 bool // Threshold 0: refuses everything
	be                  *BlockError
}

func newGCRARule(g *gcra, r *Rule) gcraRule {
	gr := gcraRule{g: g, burst: int64(r.Burst), be: newBlockError(r, ReasonFlow), off: r.Threshold == 0}
	if !gr.off {
		// Whole nanoseconds per token: at most 1e12/s, so at least 1 ns.
		gr.interval = max(int64(math.Round(1e9/r.Threshold)), 1)
		gr.tolerance = gr.interval * gr.burst
	}
	return gr
}

// take takes n tokens at now if they are there within maxWait, and
// returns how long the caller waits for them and the arrival time it set
// (its token for give); refused, it reports when they would be there (the
// wait, -1 when never: more than Burst) and how long until the bucket is
// full again.
func (r *gcraRule) take(now, n, maxWait int64) (wait, tok int64, ok bool, rm room) {
	if r.off || n > r.burst {
		return 0, 0, false, unknownRoom
	}
	cost := n * r.interval // at most 30 days (validated): no overflow
	for {
		tat := r.g.tat.Load()
		next := max(tat, now) + cost
		over := next - now - r.tolerance // maxWait <= MaxWait: no overflow
		if over > maxWait {
			return 0, 0, false, room{over, max(tat-now, 0)}
		}
		if r.g.tat.CompareAndSwap(tat, next) {
			return max(over, 0), next, true, room{}
		}
	}
}

// give gives back n tokens that take took, setting arrival time tok (the
// request was not admitted in the end), if no request has taken tokens
// since: the arrival time moves back by their cost. Once another request
// took tokens after them, they stay spent: moving the arrival time back
// under that request's would hand its tokens out a second time (two
// requests on one slot), so the cancelled request errs towards blocking.
func (r *gcraRule) give(n, tok int64) { r.g.tat.CompareAndSwap(tok, tok-n*r.interval) }
