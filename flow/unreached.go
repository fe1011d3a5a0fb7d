package flow

import (
	"strings"
	"time"

	"github.com/leapflow/leapflow/internal/stats"
)

// CatchAllSuffix ends the name of a resource where an adapter puts the
// requests it could not name by their route: httpflow's is
// "http:unmatched". Traffic there while a rule's resource sees none is
// what Unreached reports.
const CatchAllSuffix = ":unmatched"

// unreachedAfter is how long a resource is under rules before Unreached
// may report them: a service's first requests may all be unmatched ones.
const unreachedAfter = 10 * time.Second

// ruledSince is when a resource came under rules, and what it had counted
// then.
type ruledSince struct{ at, counted int64 }

// Unreached returns the rules in force (dry-run ones too) that most likely
// cannot take effect: their resource has counted no request, passed or
// blocked, since it came under rules (10 s ago or more), while a catch-all
// resource (a name ending in CatchAllSuffix) counted some over the last
// minute. Requests are then named otherwise than the rule: a router whose
// adapter names them by another pattern, a typo, a missing method. nil
// when there are none. It reads every resource: call it from a ticker or a
// scrape, not per request.
func (e *Engine) Unreached() []Rule {
	set := e.ruleSet()
	now := e.now()
	caught := false
	e.registry.Range(func(n *stats.Node) bool {
		if strings.HasSuffix(n.Resource(), CatchAllSuffix) && n.CountedSince(now-int64(time.Minute), now) > 0 {
			caught = true
			return false
		}
		return true
	})
	if !caught {
		return nil
	}
	var out []Rule
	for _, r := range set.rules {
		since, ok := set.since[r.Resource]
		if !ok || now-since.at < int64(unreachedAfter) || strings.HasSuffix(r.Resource, CatchAllSuffix) {
			continue
		}
		if n := e.registry.Lookup(r.Resource); n == nil || n.Counted() == since.counted {
			out = append(out, r)
		}
	}
	return out
}
