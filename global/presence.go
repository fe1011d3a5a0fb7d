package global

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// renewPresence renews this instance's presence in every limit it keeps a
// share of, every third of Options.PresenceTTL, until Close. It does not
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
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.CallTimeout)
	defer cancel()
	rejoin := 0
	if s.fellBack.Swap(false) {
		rejoin = 1
	}
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
	run := func(pipe redis.Pipeliner, sha bool) {
		for _, l := range renewed {
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
	_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error { run(pipe, true); return nil })
	if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
		_, err = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error { run(pipe, false); return nil })
	}
	if err != nil {
		if rejoin == 1 {
			s.fellBack.Store(true) // not told: tell it next time
		}
		return
	}
	for _, l := range renewed {
		l.present = true
	}
	for _, l := range left {
		l.present = false
	}
}

// leave removes this instance's presence when it closes, unless it fell
// back since it last renewed (the others then keep its shares until the
// presence lapses and for PresenceHold after).
func (s *Source) leave() {
	if s.fellBack.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CallTimeout)
	defer cancel()
	_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		s.limits.Range(func(_, v any) bool {
			if l := v.(*limit); l.present && l.downUntil.Load() == 0 {
				pipe.HDel(ctx, l.hash(), s.field())
			}
			return true
		})
		return nil
	})
}
