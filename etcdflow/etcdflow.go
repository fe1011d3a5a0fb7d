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
//     order: events at or below a revision already applied (a member that
//     restored a snapshot sends them again) are skipped;
//   - a watch whose revision was compacted away reads every rule again,
//     and so does a store found behind the last revision seen (restored
//     from a backup, or replaced);
//   - every 10 s the source reads the store's revision (a count, no
//     values; each read times out after 10 s): a store it cannot reach is
//     reported once, and the report clears when it answers again;
//   - reads are bounded: a prefix is counted before its values are read,
//     then read 16 keys at a time at one revision, refused past
//     WithMaxKeys keys or 64 MiB of values; a watch that takes it past
//     either drops what it holds and reads the count again until it is
//     back under.
//
// A prefix is a string prefix, as etcd's: "/leapflow/rules" also takes
// "/leapflow/rules-staging/x"; end it with a "/".
//
// It works with etcd 3.4 and later (the client is go.etcd.io/etcd/client/v3
// v3.5).
package etcdflow

import (
	"bytes"
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
	// timeout bounds each read; checkEvery is how often a watch reads the
	// store's revision (see watch).
	timeout, checkEvery time.Duration
	retry               time.Duration // the first retry's wait (tests shorten it)
	rev                 atomic.Int64
}

// Option shapes a Source.
type Option func(*Source)

// WithPrefix reads every key that starts with the source's key (a string
// prefix: end it with "/") as a rule file: their rules are merged in key
// order, and a rule ID defined under two keys is an error naming both. A
// change to one key parses that key only.
func WithPrefix() Option { return func(s *Source) { s.prefix = true } }

// WithMaxKeys bounds how many keys a prefix may hold (default
// DefaultMaxKeys; at least 1): more is an error, and the rules in force
// stay.
func WithMaxKeys(n int) Option { return func(s *Source) { s.maxKeys = max(n, 1) } }

// New returns the source of the rules at key (under key, WithPrefix) in
// the etcd that client talks to. The client stays the caller's: Run
// neither closes it nor changes its settings.
func New(client *clientv3.Client, key string, opts ...Option) *Source {
	s := &Source{client: client, key: key, maxKeys: DefaultMaxKeys, retry: firstRetry, timeout: 10 * time.Second, checkEvery: 10 * time.Second}
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
	// parsed are the rules of each key's value as last parsed: a change
	// to one key of a prefix parses that key only.
	parsed map[string]parsedValue
}

// parsedValue is a value and its rules.
type parsedValue struct {
	value []byte
	rules []flow.Rule
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

// page is how many keys one read of a prefix takes: values are read a
// page at a time, so that no more than maxTotal and a page are held.
const page = 16

// load reads every key the source follows and the revision it read at:
// a prefix a page at a time at one revision, refused past maxKeys keys or
// maxTotal bytes (a count first, which reads no value), each read within
// the source's timeout.
func (s *Source) load(ctx context.Context, st *state) error {
	fail := func(err error) error {
		return fmt.Errorf("etcdflow: reading %s: %w: the rules in force stay", s.key, err)
	}
	read := func(key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		return s.client.Get(rctx, key, opts...)
	}
	if !s.prefix {
		resp, err := read(s.key)
		if err != nil {
			return fail(err)
		}
		st.kv = map[string][]byte{}
		for _, kv := range resp.Kvs {
			st.kv[string(kv.Key)] = kv.Value
		}
		st.rev, st.loaded = resp.Header.Revision, true
		return nil
	}
	count, err := read(s.key, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fail(err)
	}
	if count.Count > int64(s.maxKeys) {
		return s.tooMany()
	}
	rev, end := count.Header.Revision, clientv3.GetPrefixRangeEnd(s.key)
	kvs, total := map[string][]byte{}, 0
	for from := s.key; ; {
		resp, err := read(from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(page))
		if err != nil {
			return fail(err)
		}
		for _, kv := range resp.Kvs {
			kvs[string(kv.Key)] = kv.Value
			total += len(kv.Value)
		}
		switch {
		case len(kvs) > s.maxKeys:
			return s.tooMany()
		case total > maxTotal:
			return fmt.Errorf("etcdflow: the values under %s are more than %d bytes: the rules in force stay", s.key, maxTotal)
		case !resp.More || len(resp.Kvs) == 0:
			st.kv, st.rev, st.loaded = kvs, rev, true
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// size is the bytes of kv's values.
func size(kv map[string][]byte) int {
	n := 0
	for _, v := range kv {
		n += len(v)
	}
	return n
}

// tooMany is the error of a prefix over maxKeys keys.
func (s *Source) tooMany() error {
	return fmt.Errorf("etcdflow: %s holds more than %d keys: the rules in force stay", s.key, s.maxKeys)
}

// watch follows the keys from st.rev on, applying each response's events,
// until the watch ends. It reports whether to wait before watching again
// (false: read everything again now); progress is called once the watch
// delivers anything. Every checkEvery it reads the store's revision (a
// count, no values): a store behind what the source saw (restored, or
// replaced) is read again whole; one it cannot reach is reported; and
// once it answers again an error of the watch's is cleared.
func (s *Source) watch(ctx context.Context, st *state, update func([]flow.Rule, error), progress func()) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithRev(st.rev + 1), clientv3.WithProgressNotify()}
	if s.prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	// Watch waits until the store is reached: the checks run meanwhile.
	started := make(chan clientv3.WatchChan, 1)
	go func() { started <- s.client.Watch(wctx, s.key, opts...) }()
	var watch clientv3.WatchChan // nil, which never delivers, until started
	check := time.NewTicker(s.checkEvery)
	defer check.Stop()
	for {
		var resp clientv3.WatchResponse
		select {
		case watch = <-started:
			continue
		case <-check.C:
			if !s.check(ctx, st, update) {
				st.loaded = false
				return false
			}
			continue
		case r, ok := <-watch:
			if !ok {
				return true
			}
			resp = r
		}
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
		if resp.Header.Revision < st.rev {
			// A store behind what was read: restored from a backup, or
			// another one at the same address. Read it again whole.
			st.loaded = false
			return false
		}
		if resp.IsProgressNotify() {
			// Every event up to the header's revision was delivered.
			st.rev = max(st.rev, resp.Header.Revision)
			continue
		}
		base, changed := st.rev, false
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision <= base {
				continue // sent again (a member that restored a snapshot): applied already
			}
			switch ev.Type {
			case mvccpb.PUT:
				st.kv[string(ev.Kv.Key)] = ev.Kv.Value
			case mvccpb.DELETE:
				delete(st.kv, string(ev.Kv.Key))
			}
			st.rev, changed = max(st.rev, ev.Kv.ModRevision), true
		}
		if !changed {
			continue
		}
		if len(st.kv) > s.maxKeys || size(st.kv) > maxTotal {
			// Over a bound: hold no more of it; read again (a count
			// first) until it is back under.
			err := s.tooMany()
			if len(st.kv) <= s.maxKeys {
				err = fmt.Errorf("etcdflow: the values under %s are more than %d bytes: the rules in force stay", s.key, maxTotal)
			}
			s.fail(st, update, err)
			st.kv, st.loaded = nil, false
			return true
		}
		s.apply(st, update)
	}
}

// check reads the store's revision; it reports false when the store is
// behind what the source saw.
func (s *Source) check(ctx context.Context, st *state, update func([]flow.Rule, error)) bool {
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithCountOnly()}
	if s.prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	resp, err := s.client.Get(rctx, s.key, opts...)
	switch {
	case ctx.Err() != nil:
		return true
	case err != nil:
		s.fail(st, update, fmt.Errorf("etcdflow: reading %s: %w: the rules in force stay", s.key, err))
		return true
	case resp.Header.Revision < st.rev:
		return false
	case st.failed:
		s.apply(st, update) // passes the rules again: an error that was the store's clears
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
	rules, err := s.rules(st, keys)
	if err != nil {
		s.fail(st, update, err)
		return
	}
	st.applied, st.failed, st.lastErr = sum, false, ""
	update(rules, nil)
}

// rules parses and merges the values of keys (a value parsed before and
// unchanged is not parsed again).
func (s *Source) rules(st *state, keys []string) ([]flow.Rule, error) {
	kv := st.kv
	if len(keys) == 0 {
		what := "key " + s.key + " is missing"
		if s.prefix {
			what = "no key under " + s.key
		}
		// As an empty file: clearing every rule takes "rules: []".
		return nil, errors.New("etcdflow: " + what + `: the rules in force stay (write "rules: []" to clear them)`)
	}
	if len(keys) > s.maxKeys {
		return nil, s.tooMany()
	}
	total := 0
	for _, k := range keys {
		total += len(kv[k])
	}
	if total > maxTotal {
		return nil, fmt.Errorf("etcdflow: the values under %s are more than %d bytes: the rules in force stay", s.key, maxTotal)
	}
	var all []flow.Rule
	defined := map[string]string{}
	parsed := make(map[string]parsedValue, len(keys))
	defer func() { st.parsed = parsed }()
	for _, k := range keys {
		v := kv[k]
		if len(v) > rulefile.MaxFileSize {
			return nil, &rulefile.Error{File: k, Msg: fmt.Sprintf("the value is %d bytes, more than %d", len(v), rulefile.MaxFileSize)}
		}
		p, ok := st.parsed[k]
		if !ok || !bytes.Equal(p.value, v) {
			rules, err := rulefile.Check(k, v)
			if err != nil {
				return nil, err
			}
			p = parsedValue{v, rules}
		}
		parsed[k] = p
		rules := p.rules
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
