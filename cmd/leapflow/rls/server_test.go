package rls

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

const edgeConfig = `
domain: edge
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 3
  - key: remote_address
    rate_limit:
      name: per-ip
      unit: minute
      requests_per_unit: 2
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bar
        rate_limit:
          unit: hour
          requests_per_unit: 4
  - key: plan
    value: free
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: trial
    value: new
    shadow_mode: true
    rate_limit:
      unit: second
      requests_per_unit: 1
  - key: internal
    rate_limit:
      unlimited: true
`

// serve starts s on a real gRPC server on a loopback port and returns a
// client of it.
func serve(t *testing.T, s *Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	go gs.Serve(ln) //nolint:errcheck // Serve returns when stopped
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc)
}

// newServer is a server of config on an engine of clock.
func newServer(t *testing.T, clock *stattest.Clock, config string, opts Options) (*Server, rlsv3.RateLimitServiceClient) {
	t.Helper()
	eng, err := flow.New(flow.WithClock(clock))
	require.NoError(t, err)
	cfg, err := ParseConfig([]string{"edge.yaml"}, map[string][]byte{"edge.yaml": []byte(config)})
	require.NoError(t, err)
	s := New(eng, opts)
	require.NoError(t, s.Load(cfg, nil))
	return s, serve(t, s)
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds, HitsAddend: hits})
	require.NoError(t, err)
	require.Len(t, resp.Statuses, len(ds))
	return resp
}

// codes returns the overall code of n asks of d.
func overall(t *testing.T, c rlsv3.RateLimitServiceClient, n int, d *ratelimitv3.RateLimitDescriptor) []rlsv3.RateLimitResponse_Code {
	var out []rlsv3.RateLimitResponse_Code
	for range n {
		out = append(out, ask(t, c, 0, d).OverallCode)
	}
	return out
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestALimitAdmitsItsRequestsPerUnitAndAnswersWhatIsLeft(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	for i := range 3 {
		resp := ask(t, c, 0, desc("database", "users"))
		require.Equal(t, ok, resp.OverallCode, "request %d", i)
		st := resp.Statuses[0]
		assert.Equal(t, uint32(3), st.CurrentLimit.GetRequestsPerUnit())
		assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_SECOND, st.CurrentLimit.GetUnit())
		assert.Equal(t, uint32(2-i), st.LimitRemaining, "request %d", i)
		assert.Positive(t, st.DurationUntilReset.AsDuration())
		assert.LessOrEqual(t, st.DurationUntilReset.AsDuration(), time.Second)
	}
	resp := ask(t, c, 0, desc("database", "users"))
	assert.Equal(t, over, resp.OverallCode)
	assert.Equal(t, over, resp.Statuses[0].Code)
	assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
	// A descriptor of no limit (another value, an unknown key, an
	// unlimited one) is OK without a current limit.
	for _, d := range []*ratelimitv3.RateLimitDescriptor{desc("database", "orders"), desc("nothing", "x"), desc("internal", "a")} {
		resp := ask(t, c, 0, d)
		assert.Equal(t, ok, resp.OverallCode)
		assert.Nil(t, resp.Statuses[0].CurrentLimit)
	}
	clock.Advance(time.Second)
	assert.Equal(t, ok, ask(t, c, 0, desc("database", "users")).OverallCode, "the next second admits again")
}

func TestAWildcardKeyLimitsEachValueOnItsOwn(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over}, overall(t, c, 3, desc("remote_address", "10.0.0.1")))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over}, overall(t, c, 3, desc("remote_address", "10.0.0.2")))
	resp := ask(t, c, 0, desc("remote_address", "10.0.0.3"))
	assert.Equal(t, "per-ip", resp.Statuses[0].CurrentLimit.GetName())
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, resp.Statuses[0].CurrentLimit.GetUnit())
	clock.Advance(time.Minute)
	assert.Equal(t, ok, ask(t, c, 0, desc("remote_address", "10.0.0.1")).OverallCode)
}

func TestNestedDescriptorsMatchTheWholePath(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	// The parent alone has no limit; the path to bar has 4 per hour.
	assert.Nil(t, ask(t, c, 0, desc("source_cluster", "proxy")).Statuses[0].CurrentLimit)
	assert.Nil(t, ask(t, c, 0, desc("source_cluster", "proxy", "destination_cluster", "baz")).Statuses[0].CurrentLimit)
	got := overall(t, c, 5, desc("source_cluster", "proxy", "destination_cluster", "bar"))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok, over}, got)
}

func TestHourLimitsSlideOnTheClock(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	d := desc("source_cluster", "proxy", "destination_cluster", "bar")
	for range 4 {
		require.Equal(t, ok, ask(t, c, 0, d).OverallCode)
		clock.Advance(10 * time.Minute)
	}
	// 40 minutes on: the hour holds 4.
	assert.Equal(t, over, ask(t, c, 0, d).OverallCode)
	resp := ask(t, c, 0, d)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_HOUR, resp.Statuses[0].CurrentLimit.GetUnit())
	// An hour after the first: its window has room again.
	clock.Advance(30 * time.Minute)
	assert.Equal(t, ok, ask(t, c, 0, d).OverallCode)
}

func TestDayLimitsSlideOverTheDay(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	d := desc("plan", "free")
	resp := ask(t, c, 99, d)
	require.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_DAY, resp.Statuses[0].CurrentLimit.GetUnit())
	assert.Equal(t, uint32(100), resp.Statuses[0].CurrentLimit.GetRequestsPerUnit())
	assert.Equal(t, uint32(1), resp.Statuses[0].LimitRemaining)
	assert.Equal(t, 23*time.Hour, resp.Statuses[0].DurationUntilReset.AsDuration(), "at 1 h: their bucket, [0, 6 h), leaves the window at 24 h")
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, over}, overall(t, c, 2, d))
	// Still the same day 23 hours on; a day after their bucket, all of it.
	clock.Advance(22 * time.Hour)
	assert.Equal(t, over, ask(t, c, 0, d).OverallCode)
	clock.Advance(2 * time.Hour)
	assert.Equal(t, ok, ask(t, c, 100, d).OverallCode)
	assert.Equal(t, over, ask(t, c, 0, d).OverallCode)
}

func TestDayLimitsPerValue(t *testing.T) {
	clock := stattest.NewClock(0)
	_, c := newServer(t, clock, "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 3}\n", Options{})
	for _, k := range []string{"k1", "k2"} {
		assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}, overall(t, c, 4, desc("api_key", k)), k)
	}
	clock.Advance(24 * time.Hour)
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}, overall(t, c, 4, desc("api_key", "k1")))
}

func TestHitsAddendCountsItsHitsAndAnExplicitZeroOnlyReads(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	d := desc("database", "users")
	resp := ask(t, c, 2, d) // request-level 2
	require.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, uint32(1), resp.Statuses[0].LimitRemaining)
	read := desc("database", "users")
	read.HitsAddend = wrapperspb.UInt64(0)
	for range 3 {
		resp = ask(t, c, 0, read)
		assert.Equal(t, ok, resp.OverallCode)
		assert.Equal(t, uint32(1), resp.Statuses[0].LimitRemaining, "a read counts nothing")
	}
	two := desc("database", "users")
	two.HitsAddend = wrapperspb.UInt64(2) // over the one left
	assert.Equal(t, over, ask(t, c, 5, two).OverallCode, "the descriptor's hits_addend overrides the request's")
	assert.Equal(t, ok, ask(t, c, 0, d).OverallCode, "a request-level 0 counts one")
	assert.Equal(t, over, ask(t, c, 0, d).OverallCode)
}

func TestShadowModeAnswersOKAndCountsWhatItWouldRefuse(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	s, c := newServer(t, clock, edgeConfig, Options{})
	for range 4 {
		resp := ask(t, c, 0, desc("trial", "new"))
		assert.Equal(t, ok, resp.OverallCode)
		assert.Equal(t, uint32(1), resp.Statuses[0].CurrentLimit.GetRequestsPerUnit())
	}
	var would int64
	for _, dr := range s.eng.DryRuns() {
		would += dr.WouldBlock
	}
	assert.Equal(t, int64(3), would)
}

func TestAnyOverLimitDescriptorMakesTheAnswerOverLimit(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	ask(t, c, 2, desc("remote_address", "10.1.1.1"))
	resp := ask(t, c, 0, desc("database", "users"), desc("remote_address", "10.1.1.1"))
	assert.Equal(t, over, resp.OverallCode)
	assert.Equal(t, ok, resp.Statuses[0].Code)
	assert.Equal(t, over, resp.Statuses[1].Code)
}

func TestHeadersDescribeTheLimitWithLeastLeft(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{Headers: true})
	resp := ask(t, c, 0, desc("database", "users"), desc("remote_address", "10.2.2.2"))
	fields := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		fields[h.Key] = h.Value
	}
	assert.Equal(t, `"per-ip";q=2;w=60`, fields["RateLimit-Policy"])
	assert.Equal(t, `"per-ip";r=1;t=60`, fields["RateLimit"])
	assert.NotContains(t, fields, "Retry-After")
	ask(t, c, 0, desc("remote_address", "10.2.2.2"))
	resp = ask(t, c, 0, desc("remote_address", "10.2.2.2"))
	require.Equal(t, over, resp.OverallCode)
	fields = map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		fields[h.Key] = h.Value
	}
	assert.Equal(t, "60", fields["Retry-After"])
	assert.Equal(t, `"per-ip";r=0;t=60`, fields["RateLimit"])
}

func TestRequestsOverTheBoundsAreRefusedNamingTheField(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	_, c := newServer(t, clock, edgeConfig, Options{})
	long := string(make([]byte, maxEntryLen+1))
	many := make([]*ratelimitv3.RateLimitDescriptor, MaxRequestDescriptors+1)
	for i := range many {
		many[i] = desc("database", "users")
	}
	override := desc("database", "users")
	override.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10}
	deep := desc()
	for range MaxDepth + 1 {
		deep.Entries = append(deep.Entries, desc("a", "b").Entries...)
	}
	for _, tc := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}}, "domain"},
		{&rlsv3.RateLimitRequest{Domain: "edge"}, "descriptors"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: many}, "descriptors: 65"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", long)}}, "descriptors[0].entries[0].value"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(long, "b")}}, "descriptors[0].entries[0].key"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b"), override}}, "descriptors[1].limit"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{deep}}, "descriptors[0].entries"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}, HitsAddend: MaxHits + 1}, "hits_addend"},
	} {
		_, err := c.ShouldRateLimit(context.Background(), tc.req)
		require.Error(t, err, tc.want)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), tc.want)
		assert.Contains(t, status.Convert(err).Message(), tc.want)
	}
}

func TestLeapflowRulesServeDescriptorsAsResourcesAndKeys(t *testing.T) {
	eng, err := flow.New(flow.WithClock(stattest.NewClock(time.Hour)))
	require.NoError(t, err)
	s := New(eng, Options{})
	own := []flow.Rule{
		{Resource: "api/tenant", Threshold: 2, PerKey: true, Keys: []flow.KeyLimit{{Key: "gold", Threshold: 3}}},
		{Resource: "api/tenant/path", Threshold: 1, PerKey: true},
	}
	require.NoError(t, s.Load(nil, own))
	c := serve(t, s)
	do := func(n int, kv ...string) []rlsv3.RateLimitResponse_Code {
		var out []rlsv3.RateLimitResponse_Code
		for range n {
			resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(kv...)}})
			require.NoError(t, err)
			out = append(out, resp.OverallCode)
		}
		return out
	}
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over}, do(3, "tenant", "acme"))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}, do(4, "tenant", "gold"))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, over}, do(2, "tenant", "acme", "path", "/a/b"))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, over}, do(2, "tenant", "acme", "path", "/a/c"))
	res, key := Resource("api", desc("tenant", "a/b", "path", "c").Entries)
	assert.Equal(t, "api/tenant/path", res)
	assert.Equal(t, `a\/b/c`, key, "values are escaped so that two tuples never share a key")
}

func TestRulesThatNeedACompletionAreRefused(t *testing.T) {
	eng, err := flow.New()
	require.NoError(t, err)
	s := New(eng, Options{})
	err = s.Load(nil, []flow.Rule{{Resource: "api/x", Metric: flow.Concurrency, Threshold: 3}})
	require.ErrorContains(t, err, "Concurrency")
	err = s.Load(nil, []flow.Rule{{Resource: "api/x", Breaker: flow.ErrorCount, Threshold: 3, StatInterval: time.Second, RetryTimeout: time.Second}})
	require.ErrorContains(t, err, "circuit breaker")
}

func TestABadConfigurationChangesNothing(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	s, c := newServer(t, clock, edgeConfig, Options{})
	ask(t, c, 3, desc("database", "users"))
	_, err := ParseConfig([]string{"x"}, map[string][]byte{"x": []byte("domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")})
	require.Error(t, err)
	// A rule flow refuses, beside a good configuration, fails Load whole.
	good, err := ParseConfig([]string{"x"}, map[string][]byte{"x": []byte("domain: edge\ndescriptors:\n  - key: database\n    value: users\n    rate_limit: {unit: second, requests_per_unit: 100}\n")})
	require.NoError(t, err)
	require.ErrorContains(t, s.Load(good, []flow.Rule{{Resource: "edge/x", Threshold: -1}}), "Threshold")
	require.ErrorContains(t, s.Load(good, []flow.Rule{{Resource: "edge/database=users", Threshold: 1}}), "both")
	assert.Equal(t, over, ask(t, c, 0, desc("database", "users")).OverallCode, "the last good configuration, with its counts, stays")
}

func TestConfigErrorsNameTheDescriptorAndField(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"descriptors: []\n", "domain: must not be empty"},
		{"domain: d\ndescriptors:\n  - value: x\n", "key: must not be empty"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: week, requests_per_unit: 1}\n", `d/k: rate_limit.unit "week"`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n", "requests_per_unit: required"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "requests_per_unit -1"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 4294967296}\n", "requests_per_unit 4294967296"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a*\n", "prefix wildcards"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a\n  - key: k\n    value: a\n", "configured twice"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [x]}\n", "replaces"},
		{"domain: d\ndescriptors:\n  - key: k\n    colour: red\n", "colour"},
		{"domain: d\nx: &a [1]\ny: *a\n", "anchors and aliases"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "unlimited takes no unit"},
	} {
		_, err := ParseConfig([]string{"f.yaml"}, map[string][]byte{"f.yaml": []byte(tc.yaml)})
		require.Error(t, err, tc.yaml)
		assert.Contains(t, err.Error(), tc.want, tc.yaml)
		assert.Contains(t, err.Error(), "f.yaml", tc.yaml)
	}
	// Two files of one domain.
	one := []byte("domain: d\ndescriptors: []\n")
	_, err := ParseConfig([]string{"a", "b"}, map[string][]byte{"a": one, "b": one})
	assert.ErrorContains(t, err, "two files")
}

func TestDeepOrHugeConfigurationsAreRefused(t *testing.T) {
	y := "domain: d\ndescriptors:\n"
	indent := "  "
	for range MaxDepth + 1 {
		y += indent + "- key: k\n" + indent + "  value: v\n" + indent + "  descriptors:\n"
		indent += "    "
	}
	_, err := ParseConfig([]string{"f"}, map[string][]byte{"f": []byte(y)})
	assert.ErrorContains(t, err, "nested deeper than")
	_, err = ParseConfig([]string{"f"}, map[string][]byte{"f": make([]byte, MaxConfigSize+1)})
	assert.ErrorContains(t, err, "larger than")
	// Flow nesting is refused before the parser, whose cost grows with its
	// square: 100 KB of it would take gigabytes.
	deep := "domain: d\ndescriptors: " + strings.Repeat("[", 50_000) + strings.Repeat("]", 50_000) + "\n"
	_, err = ParseConfig([]string{"f"}, map[string][]byte{"f": []byte(deep)})
	assert.ErrorContains(t, err, "line 2: nested deeper than 72")
	var many strings.Builder
	many.WriteString("domain: d\ndescriptors:\n")
	for i := range MaxLimits + 1 {
		fmt.Fprintf(&many, "  - {key: k, value: v%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	_, err = ParseConfig([]string{"f"}, map[string][]byte{"f": []byte(many.String())})
	assert.ErrorContains(t, err, "more than 10000 limits")
}

// An empty value is a key without one, as envoyproxy/ratelimit reads it:
// a limit per distinct value.
func TestAnEmptyValueLimitsEachValue(t *testing.T) {
	_, c := newServer(t, stattest.NewClock(time.Hour), "domain: edge\ndescriptors:\n  - key: remote_address\n    value: \"\"\n    rate_limit: {unit: minute, requests_per_unit: 2}\n", Options{})
	for _, ip := range []string{"1.2.3.4", "5.6.7.8"} {
		assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over}, overall(t, c, 3, desc("remote_address", ip)), ip)
	}
}

// Limits keep apart whatever their names: a name is a label, which limits
// in two domains may share (their counts, through Redis too, are their
// descriptor paths').
func TestLimitsSharingANameCountApart(t *testing.T) {
	cfg, err := ParseConfig([]string{"a", "b"}, map[string][]byte{
		"a": []byte("domain: one\ndescriptors:\n  - key: ip\n    rate_limit: {name: per-ip, unit: minute, requests_per_unit: 3}\n"),
		"b": []byte("domain: two\ndescriptors:\n  - key: ip\n    rate_limit: {name: per-ip, unit: minute, requests_per_unit: 3}\n"),
	})
	require.NoError(t, err)
	rules, err := cfg.Rules(Options{})
	require.NoError(t, err)
	require.Len(t, rules, 2)
	for _, r := range rules {
		assert.Empty(t, r.ID, "no ID from a name")
	}
	assert.NotEqual(t, rules[0].Resource, rules[1].Resource)
}

// Eleven limits per value load (the engine's million keys shared among
// them), where flow's default of 100,000 each would pass its bound.
func TestManyLimitsPerValueShareTheEnginesKeys(t *testing.T) {
	var y strings.Builder
	y.WriteString("domain: d\ndescriptors:\n")
	for i := range 11 {
		fmt.Fprintf(&y, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: 5}\n", i)
	}
	_, c := newServer(t, stattest.NewClock(time.Hour), y.String(), Options{})
	assert.Equal(t, ok, ask(t, c, 0, desc("k3", "v")).OverallCode)
}
