package global

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// renewPresence renews this instance's presence in every limit it keeps a
// share of, every third of WithPresenceTTL, until Close. It does not
// renew a limit that backs off: an instance that cannot reach Redis lets
// its presence lapse, and the others then keep its shares.
func (s *Source) renewPresence() {
	tick := time.NewTicker(s.opts.PresenceTTL / 3)
	defer tick.Stop()
	for {
		s.renew()
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// field is this instance's presence field in a limit's hash.
func (s *Source) field() string { return "p:" + s.id }

// renew makes one round of renewals, pipelined. Limits whose rules are
// gone (every bound source collected), and limits this instance no longer
// keeps a share of, lose its presence.
func (s *Source) renew() {
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.CallTimeout)
	defer cancel()
	keep := (s.opts.PresenceHold + s.opts.PresenceTTL).Milliseconds()
	var renewed, left []*limit
	s.limits.Range(func(_, v any) bool {
		l := v.(*limit)
		// A limit whose rules are all gone stays in the map (a reload
		// may bind it again) but is not renewed.
		gone := l.bound.Load() && l.binds.Load() == 0
		switch {
		case l.downUntil.Load() != 0:
			// Backing off: let the presence lapse.
		case l.share.Load() > 0 && !gone:
			renewed = append(renewed, l)
		case l.present:
			left = append(left, l)
		}
		return true
	})
	// Only the limits renewed now are told they fell back: a limit that
	// backs off keeps its flag for the renewal after its backoff. A limit
	// whose fallback's admissions are carried into its window (see
	// carried) has them counted there already, once a call took them.
	rejoins := make([]int, len(renewed))
	now := s.opts.Clock.Now()
	for i, l := range renewed {
		if l.fellBack.Swap(false) && (!l.counting.Load() || l.carried.pending(now, l.window)) {
			rejoins[i] = 1
		}
	}
	run := func(pipe redis.Pipeliner, sha bool) {
		for i, l := range renewed {
			rejoin := rejoins[i]
			keys := []string{l.hash()}
			args := []any{s.id, l.share.Load(), s.opts.PresenceTTL.Microseconds(), l.window, rejoin, keep, serverStep}
			if sha {
				presenceScript.EvalSha(ctx, pipe, keys, args...)
			} else {
				presenceScript.Eval(ctx, pipe, keys, args...)
			}
		}
		for _, l := range left {
			pipe.HDel(ctx, l.hash(), s.field())
		}
	}
	// Each command is judged on its own: in a Redis Cluster one node can
	// fail while the others answer.
	cmds, _ := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error { run(pipe, true); return nil })
	if noScript(cmds) {
		cmds, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error { run(pipe, false); return nil })
	}
	failed := func(i int) bool { return i >= len(cmds) || cmds[i].Err() != nil }
	for i, l := range renewed {
		if failed(i) {
			if rejoins[i] == 1 {
				l.fellBack.Store(true) // not told: tell it next time
			}
			continue
		}
		l.present = true
	}
	for i, l := range left {
		if !failed(len(renewed) + i) {
			l.present = false
		}
	}
}

// noScript reports whether a command of a pipeline found its script
// missing (a restarted or flushed Redis).
func noScript(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

// leave removes this instance's presence when it closes, except from
// limits that fell back since they were last renewed (the others then keep
// its share of them until the presence lapses and for PresenceHold after).
func (s *Source) leave() {
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CallTimeout)
	defer cancel()
	_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		s.limits.Range(func(_, v any) bool {
			if l := v.(*limit); l.present && l.downUntil.Load() == 0 && !l.fellBack.Load() {
				pipe.HDel(ctx, l.hash(), s.field())
			}
			return true
		})
		return nil
	})
}
