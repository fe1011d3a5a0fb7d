package etcdflow

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/leapflow/leapflow/etcdflow/internal/etcdtest"
	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/rulefile"
)

// client is an etcd client of endpoint that reconnects within a fifth of
// a second, closed when the test ends.
func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.5, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// put writes key's value.
func put(t *testing.T, cli *clientv3.Client, key, value string) int64 {
	t.Helper()
	resp, err := cli.Put(context.Background(), key, value)
	require.NoError(t, err)
	return resp.Header.Revision
}

// ruleFile is a rule file of one rule per id, on resource api.
func ruleFile(ids ...string) string {
	s := "rules:\n"
	for _, id := range ids {
		s += fmt.Sprintf("  - id: %s\n    resource: api-%s\n    threshold: 5\n", id, id)
	}
	return s
}

// update is one call of Run's update.
type update struct {
	ids []string
	err error
	rev int64
}

// recorder runs a source and keeps its updates.
type recorder struct {
	mu      sync.Mutex
	updates []update
}

func record(t *testing.T, src *Source) *recorder {
	t.Helper()
	src.retry, src.checkEvery, src.timeout = 10*time.Millisecond, 50*time.Millisecond, 300*time.Millisecond
	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Run(ctx, func(rules []flow.Rule, err error) {
			u := update{err: err, rev: src.Revision()}
			for _, rule := range rules {
				u.ids = append(u.ids, rule.ID)
			}
			r.mu.Lock()
			r.updates = append(r.updates, u)
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

func (r *recorder) all() []update {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]update(nil), r.updates...)
}

// applied is the rule sets passed on without an error.
func (r *recorder) applied() [][]string {
	var out [][]string
	for _, u := range r.all() {
		if u.err == nil {
			out = append(out, u.ids)
		}
	}
	return out
}

// waitApplied waits until the last rule set passed on is ids.
func (r *recorder) waitApplied(t *testing.T, ids ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		a := r.applied()
		return len(a) > 0 && fmt.Sprint(a[len(a)-1]) == fmt.Sprint(ids)
	}, 20*time.Second, 5*time.Millisecond, "rules %v never applied; updates %+v", ids, r.all())
}

// errors counts the error updates containing text.
func (r *recorder) errors(text string) int {
	n := 0
	for _, u := range r.all() {
		if u.err != nil && strings.Contains(u.err.Error(), text) {
			n++
		}
	}
	return n
}

// waitError waits for an error update containing text.
func (r *recorder) waitError(t *testing.T, text string) {
	t.Helper()
	require.Eventually(t, func() bool { return r.errors(text) > 0 },
		20*time.Second, 5*time.Millisecond, "no error with %q; updates %+v", text, r.all())
}

// revisionsIncrease checks that the updates' revisions never go back.
func revisionsIncrease(t *testing.T, us []update) {
	t.Helper()
	for i := 1; i < len(us); i++ {
		assert.GreaterOrEqual(t, us[i].rev, us[i-1].rev, "update %d of %+v", i, us)
	}
}

// The rules follow the key: each change is passed on, a deleted key is an
// error that keeps the rules in force, and a value written again as it is
// passes nothing on.
func TestRulesFollowTheKey(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	put(t, cli, "/rules", ruleFile("a"))
	r := record(t, New(cli, "/rules"))
	r.waitApplied(t, "a")
	rev := put(t, cli, "/rules", ruleFile("b"))
	r.waitApplied(t, "b")
	assert.Equal(t, rev, r.all()[len(r.all())-1].rev)
	put(t, cli, "/rules", ruleFile("b"))
	put(t, cli, "/other", ruleFile("x")) // not followed
	_, err := cli.Delete(context.Background(), "/rules")
	require.NoError(t, err)
	r.waitError(t, "key /rules is missing")
	put(t, cli, "/rules", ruleFile("c"))
	r.waitApplied(t, "c")
	assert.Equal(t, [][]string{{"a"}, {"b"}, {"c"}}, r.applied(), "the same value again passes nothing on")
	revisionsIncrease(t, r.all())
}

// Bad input changes nothing: an engine keeps its rules through a value
// that is not YAML, JSON cut short, and a rule the engine refuses, each
// reported with the key and what is wrong; the next good value applies.
func TestBadRulesKeepTheRulesInForce(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	put(t, cli, "/leapflow/rules", ruleFile("good"))
	eng, err := flow.New()
	require.NoError(t, err)
	var mu sync.Mutex
	var errs []error
	src := New(cli, "/leapflow/rules")
	src.retry, src.checkEvery = 10*time.Millisecond, 50*time.Millisecond
	sync := rulefile.Start(eng, src, rulefile.WithOnError(func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}))
	defer sync.Stop()
	require.Eventually(t, func() bool { return sync.Reloads() == 1 }, 20*time.Second, 5*time.Millisecond)
	for i, c := range []struct{ value, says string }{
		{"rules: [id: x", "/leapflow/rules"},
		{`{"rules": [{"id": "j", "resource": "api"`, "/leapflow/rules"},
		{"rules:\n  - id: neg\n    resource: api\n    threshold: -1\n", "threshold must be a finite number >= 0"},
		{"rules:\n  - id: r\n    resource: api\n    threshold: 1\n    bogus: 2\n", "bogus"},
	} {
		put(t, cli, "/leapflow/rules", c.value)
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(errs) == i+1
		}, 20*time.Second, 5*time.Millisecond, "value %d reported", i)
		mu.Lock()
		assert.ErrorContains(t, errs[i], c.says, "value %d", i)
		mu.Unlock()
		require.Len(t, eng.Rules(), 1)
		assert.Equal(t, "good", eng.Rules()[0].ID, "value %d: the rules in force stay", i)
		assert.Equal(t, int64(1), sync.Reloads())
	}
	put(t, cli, "/leapflow/rules", `{"rules": [{"id": "json", "resource": "api", "threshold": 2}]}`)
	require.Eventually(t, func() bool { return sync.Reloads() == 2 }, 20*time.Second, 5*time.Millisecond)
	assert.Equal(t, "json", eng.Rules()[0].ID)
	assert.NoError(t, sync.LastError())
}

// A prefix merges its keys' rules in key order; a transaction that writes
// several keys is one revision and one update, never half of it; an ID
// under two keys, or more keys than the limit, is an error naming them.
func TestAPrefixAppliesATransactionWhole(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	put(t, cli, "/p/b", ruleFile("b1"))
	put(t, cli, "/p/a", ruleFile("a1"))
	put(t, cli, "/q", ruleFile("q")) // outside the prefix
	r := record(t, New(cli, "/p/", WithPrefix(), WithMaxKeys(3)))
	r.waitApplied(t, "a1", "b1")
	resp, err := cli.Txn(context.Background()).Then(
		clientv3.OpPut("/p/a", ruleFile("a2")),
		clientv3.OpPut("/p/b", ruleFile("b2")),
		clientv3.OpPut("/p/c", ruleFile("c2")),
	).Commit()
	require.NoError(t, err)
	r.waitApplied(t, "a2", "b2", "c2")
	assert.Equal(t, [][]string{{"a1", "b1"}, {"a2", "b2", "c2"}}, r.applied(), "one update for the transaction")
	assert.Equal(t, resp.Header.Revision, r.all()[len(r.all())-1].rev)

	put(t, cli, "/p/c", ruleFile("a2"))
	r.waitError(t, `"a2": the ID is defined in /p/a too`)
	put(t, cli, "/p/d", ruleFile("d"))
	r.waitError(t, "/p/ holds more than 3 keys")
	put(t, cli, "/p/e", ruleFile("e"))
	put(t, cli, "/p/f", ruleFile("f"))
	_, err = cli.Txn(context.Background()).Then(clientv3.OpDelete("/p/c"), clientv3.OpDelete("/p/d"),
		clientv3.OpDelete("/p/e"), clientv3.OpDelete("/p/f")).Commit()
	require.NoError(t, err)
	r.waitApplied(t, "a2", "b2")
	assert.Equal(t, 1, r.errors("more than 3 keys"), "reported once while it lasts, not once a key")
}

// A restarted etcd loses no update: the rules in force stay while it is
// down, the watch resumes after it, and what is written then applies, in
// order.
func TestARestartedEtcdLosesNoUpdate(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	put(t, cli, "/rules", ruleFile("before"))
	r := record(t, New(cli, "/rules"))
	r.waitApplied(t, "before")
	srv.Restart()
	put(t, cli, "/rules", ruleFile("after1"))
	put(t, cli, "/rules", ruleFile("after2"))
	r.waitApplied(t, "after2")
	// In order, each once (the rules in force passed again after the
	// outage's error, to clear it, are no change).
	var seq []string
	for _, ids := range r.applied() {
		if s := fmt.Sprint(ids); len(seq) == 0 || seq[len(seq)-1] != s {
			seq = append(seq, s)
		}
	}
	assert.Contains(t, [][]string{{"[before]", "[after1]", "[after2]"}, {"[before]", "[after2]"}}, seq)
	revisionsIncrease(t, r.all())
}

// Cut off from etcd, the source keeps the rules in force; reconnected, it
// resumes from the last revision it saw: every update written meanwhile
// arrives, in order, and the last one is in force.
func TestUpdatesWhileCutOffArriveInOrder(t *testing.T) {
	srv := etcdtest.Start(t)
	direct := client(t, srv.Endpoint())
	proxy := etcdtest.StartProxy(t, srv.Addr())
	cli := client(t, proxy.Endpoint())
	put(t, direct, "/rules", ruleFile("v0"))
	r := record(t, New(cli, "/rules"))
	r.waitApplied(t, "v0")
	proxy.Cut()
	for i := 1; i <= 3; i++ {
		put(t, direct, "/rules", ruleFile(fmt.Sprint("v", i)))
	}
	assert.Equal(t, [][]string{{"v0"}}, r.applied(), "nothing while cut off")
	proxy.Restore()
	r.waitApplied(t, "v3")
	a := r.applied()
	for i := 1; i < len(a); i++ {
		assert.Less(t, a[i-1][0], a[i][0], "in order: %v", a)
	}
	revisionsIncrease(t, r.all())
}

// A watch that resumes at a revision compacted away reads every key
// again: a key deleted and keys written while the source was cut off are
// all seen.
func TestACompactionPastTheWatchedRevisionReadsEverything(t *testing.T) {
	srv := etcdtest.Start(t)
	direct := client(t, srv.Endpoint())
	proxy := etcdtest.StartProxy(t, srv.Addr())
	cli := client(t, proxy.Endpoint())
	put(t, direct, "/p/a", ruleFile("a"))
	put(t, direct, "/p/b", ruleFile("b"))
	src := New(cli, "/p/", WithPrefix())
	r := record(t, src)
	r.waitApplied(t, "a", "b")
	proxy.Cut()
	_, err := direct.Delete(context.Background(), "/p/b")
	require.NoError(t, err)
	put(t, direct, "/p/a", ruleFile("a2"))
	rev := put(t, direct, "/p/c", ruleFile("c"))
	_, err = direct.Compact(context.Background(), rev, clientv3.WithCompactPhysical())
	require.NoError(t, err)
	proxy.Restore()
	r.waitApplied(t, "a2", "c")
	assert.Equal(t, rev, src.Revision())
	revisionsIncrease(t, r.all())
	// And it follows on from there.
	put(t, direct, "/p/d", ruleFile("d"))
	r.waitApplied(t, "a2", "c", "d")
}

// A store that comes back behind what the source saw (restored from
// nothing at the same address, its revisions starting again) is read
// again whole: its rules apply, where a watch from the old revision would
// wait for ever.
func TestAStoreBehindTheSourceIsReadAgain(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := client(t, srv.Endpoint())
	for i := range 40 {
		put(t, cli, "/rules", ruleFile(fmt.Sprint("old", i)))
	}
	r := record(t, New(cli, "/rules"))
	r.waitApplied(t, "old39")
	srv.Wipe()
	require.Eventually(t, func() bool {
		_, err := cli.Put(context.Background(), "/rules", ruleFile("restored"))
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)
	r.waitApplied(t, "restored")
}

// A store the source cannot reach is reported (the rules in force stay),
// once; when it answers again the error clears, though the rules did not
// change.
func TestAnUnreachableStoreIsReportedThenCleared(t *testing.T) {
	srv := etcdtest.Start(t)
	proxy := etcdtest.StartProxy(t, srv.Addr())
	cli := client(t, proxy.Endpoint())
	put(t, client(t, srv.Endpoint()), "/rules", ruleFile("a"))
	r := record(t, New(cli, "/rules"))
	r.waitApplied(t, "a")
	proxy.Cut()
	r.waitError(t, "reading /rules")
	proxy.Restore()
	require.Eventually(t, func() bool {
		us := r.all()
		return us[len(us)-1].err == nil
	}, 20*time.Second, 5*time.Millisecond, "cleared: %+v", r.all())
	assert.Equal(t, 1, r.errors(""), "reported once while it lasted")
	assert.Equal(t, [][]string{{"a"}, {"a"}}, r.applied(), "the same rules, passed again to clear the error")
}
