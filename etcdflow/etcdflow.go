// Package etcdflow keeps an engine's rules those stored in etcd v3: a
// rulefile.Source over one key, or over every key under a prefix, whose
// values are rule files (YAML or JSON, as rulefile reads them).
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
//	...
//	sync := rulefile.Start(eng, etcdflow.New(cli, "/leapflow/rules"))
//	defer sync.Stop()
//
// The source reads the rules, then watches them from the revision it read
// them at:
//   - each change is applied whole or not at all: the events of one
//     revision (a transaction that writes several keys) are applied
//     together, and a rule set the engine refuses changes nothing;
//   - bad input (a value that does not parse, rules the engine refuses, a
//     missing key, a value over rulefile.MaxFileSize, more keys than
//     WithMaxKeys) is an error passed to the Sync, and the rules in force
//     stay;
//   - a lost connection keeps the rules in force; the watch resumes from
//     the last revision seen (the client's own retry, or the source's when
//     the watch ends), so no update is missed and none applies out of
//     order;
//   - a watch whose revision was compacted away reads every rule again.
//
// It works with etcd 3.4 and later (the client is go.etcd.io/etcd/client/v3
// v3.5).
package etcdflow

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/rulefile"
)

// DefaultMaxKeys is how many keys a prefix may hold by default.
const DefaultMaxKeys = 1000

// maxTotal bounds the bytes of all the values under a prefix.
const maxTotal = 64 << 20

// Retries of a failed read or an ended watch start this far apart and
// double up to maxRetry.
const (
	firstRetry = 100 * time.Millisecond
	maxRetry   = 5 * time.Second
)

// Source is the rules under an etcd key or prefix (see the package doc).
type Source struct {
	client  *clientv3.Client
	key     string
	prefix  bool
	maxKeys int
	retry   time.Duration // the first retry's wait (tests shorten it)
	rev     atomic.Int64
}

// Option shapes a Source.
type Option func(*Source)

// WithPrefix reads every key under the source's key as a rule file: their
// rules are merged in key order, and a rule ID defined under two keys is
// an error naming both.
func WithPrefix() Option { return func(s *Source) { s.prefix = true } }

// WithMaxKeys bounds how many keys a prefix may hold (default
// DefaultMaxKeys; at least 1): more is an error, and the rules in force
// stay.
func WithMaxKeys(n int) Option { return func(s *Source) { s.maxKeys = max(n, 1) } }

// New returns the source of the rules at key (under key, WithPrefix) in
// the etcd that client talks to. The client stays the caller's: Run
// neither closes it nor changes its settings.
func New(client *clientv3.Client, key string, opts ...Option) *Source {
	s := &Source{client: client, key: key, maxKeys: DefaultMaxKeys, retry: firstRetry}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Revision returns the etcd revision of the rules the source last read
// (applied or refused); 0 before the first read.
func (s *Source) Revision() int64 { return s.rev.Load() }

// state is what Run knows of the key space it follows.
type state struct {
	kv      map[string][]byte
	rev     int64 // every event up to rev is in kv
	loaded  bool
	applied [32]byte // digest of the kv last passed on without an error
	failed  bool     // the last update was an error: the same kv is news
	lastErr string   // the error passed on last, not repeated while it lasts
}

// Run implements rulefile.Source.
func (s *Source) Run(ctx context.Context, update func([]flow.Rule, error)) {
	st := state{}
	wait := s.retry
	pause := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
			wait = min(2*wait, maxRetry)
			return true
		}
	}
	for ctx.Err() == nil {
		if !st.loaded {
			if err := s.load(ctx, &st); err != nil {
				if ctx.Err() != nil {
					return
				}
				s.fail(&st, update, err)
				if !pause() {
					return
				}
				continue
			}
			s.apply(&st, update)
		}
		if s.watch(ctx, &st, update, func() { wait = s.retry }) && !pause() {
			return
		}
	}
}

// fail passes err on, the rules in force staying; the same error again
// (etcd down, retried) is passed on once.
func (s *Source) fail(st *state, update func([]flow.Rule, error), err error) {
	if st.failed && err.Error() == st.lastErr {
		return
	}
	st.failed, st.lastErr = true, err.Error()
	update(nil, err)
}

// load reads every key the source follows and the revision it read at.
func (s *Source) load(ctx context.Context, st *state) error {
	opts := []clientv3.OpOption{clientv3.WithLimit(int64(s.maxKeys) + 1)}
	if s.prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	resp, err := s.client.Get(ctx, s.key, opts...)
	if err != nil {
		return fmt.Errorf("etcdflow: reading %s: %w: the rules in force stay", s.key, err)
	}
	if len(resp.Kvs) > s.maxKeys || resp.More {
		return fmt.Errorf("etcdflow: %s holds more than %d keys: the rules in force stay", s.key, s.maxKeys)
	}
	st.kv = make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		st.kv[string(kv.Key)] = kv.Value
	}
	st.rev, st.loaded = resp.Header.Revision, true
	return nil
}

// watch follows the keys from st.rev on, applying each response's events,
// until the watch ends. It reports whether to wait before watching again
// (false: a compaction, read everything again now); progress is called
// once the watch delivers anything.
func (s *Source) watch(ctx context.Context, st *state, update func([]flow.Rule, error), progress func()) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithRev(st.rev + 1), clientv3.WithProgressNotify()}
	if s.prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	for resp := range s.client.Watch(wctx, s.key, opts...) {
		if resp.CompactRevision != 0 {
			// The revisions after st.rev are gone: read it all again.
			st.loaded = false
			return false
		}
		if err := resp.Err(); err != nil {
			if ctx.Err() == nil {
				s.fail(st, update, fmt.Errorf("etcdflow: watching %s: %w: the rules in force stay", s.key, err))
			}
			return true
		}
		progress()
		if resp.IsProgressNotify() {
			// Every event up to the header's revision was delivered.
			st.rev = max(st.rev, resp.Header.Revision)
			continue
		}
		if len(resp.Events) == 0 {
			continue
		}
		for _, ev := range resp.Events {
			switch ev.Type {
			case mvccpb.PUT:
				st.kv[string(ev.Kv.Key)] = ev.Kv.Value
			case mvccpb.DELETE:
				delete(st.kv, string(ev.Kv.Key))
			}
			st.rev = max(st.rev, ev.Kv.ModRevision)
		}
		s.apply(st, update)
	}
	return true
}

// apply passes the rules of st.kv on, unless they are those passed on
// last.
func (s *Source) apply(st *state, update func([]flow.Rule, error)) {
	s.rev.Store(st.rev)
	keys := make([]string, 0, len(st.kv))
	for k := range st.kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s%d:", len(k), k, len(st.kv[k]))
		h.Write(st.kv[k])
	}
	var sum [32]byte
	h.Sum(sum[:0])
	if sum == st.applied && !st.failed {
		return // in force already
	}
	rules, err := s.rules(keys, st.kv)
	if err != nil {
		s.fail(st, update, err)
		return
	}
	st.applied, st.failed, st.lastErr = sum, false, ""
	update(rules, nil)
}

// rules parses and merges the values of keys.
func (s *Source) rules(keys []string, kv map[string][]byte) ([]flow.Rule, error) {
	if len(keys) == 0 {
		what := "key " + s.key + " is missing"
		if s.prefix {
			what = "no key under " + s.key
		}
		// As an empty file: clearing every rule takes "rules: []".
		return nil, errors.New("etcdflow: " + what + `: the rules in force stay (write "rules: []" to clear them)`)
	}
	if len(keys) > s.maxKeys {
		return nil, fmt.Errorf("etcdflow: %s holds %d keys, more than %d: the rules in force stay", s.key, len(keys), s.maxKeys)
	}
	total := 0
	for _, k := range keys {
		total += len(kv[k])
	}
	if total > maxTotal {
		return nil, fmt.Errorf("etcdflow: the values under %s are %d bytes, more than %d: the rules in force stay", s.key, total, maxTotal)
	}
	var all []flow.Rule
	defined := map[string]string{}
	for _, k := range keys {
		v := kv[k]
		if len(v) > rulefile.MaxFileSize {
			return nil, &rulefile.Error{File: k, Msg: fmt.Sprintf("the value is %d bytes, more than %d", len(v), rulefile.MaxFileSize)}
		}
		rules, err := rulefile.Check(k, v)
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			if r.ID == "" {
				continue
			}
			if other, dup := defined[r.ID]; dup {
				return nil, &rulefile.Error{File: k, Rule: fmt.Sprintf("%q", r.ID), Msg: "the ID is defined in " + other + " too"}
			}
			defined[r.ID] = k
		}
		all = append(all, rules...)
	}
	return all, nil
}
