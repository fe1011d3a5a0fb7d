package httpflow

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRefusalFieldsAreTheDefaultAnswer: for refusals of every kind of
// rule, RefusalFields gives the status and exactly the header fields the
// default block handler writes (besides http.Error's own).
func TestRefusalFieldsAreTheDefaultAnswer(t *testing.T) {
	cases := []struct {
		name  string
		rule  flow.Rule
		conc  bool // hold one request in flight before the refused one
		c503  bool
		after time.Duration // clock advance before the refused request
		want  int
	}{
		{name: "qps", rule: flow.Rule{ID: "items", Resource: "r", Threshold: 2}, after: 300 * time.Millisecond, want: 429},
		{name: "sub-second window", rule: flow.Rule{Resource: "r", Threshold: 30, StatInterval: 100 * time.Millisecond}, want: 429},
		{name: "long window", rule: flow.Rule{Resource: "r", Threshold: 0.5, StatInterval: 4 * time.Second}, want: 429},
		{name: "quoted name", rule: flow.Rule{ID: `a "b"\c é`, Resource: "r", Threshold: 1}, want: 429},
		{name: "throttle", rule: flow.Rule{Resource: "r", Threshold: 2, Behavior: flow.Throttle}, want: 429},
		{name: "concurrency", rule: flow.Rule{Resource: "r", Metric: flow.Concurrency, Threshold: 1}, conc: true, want: 429},
		{name: "concurrency 503", rule: flow.Rule{Resource: "r", Metric: flow.Concurrency, Threshold: 1}, conc: true, c503: true, want: 503},
		{name: "qps with 503 asked", rule: flow.Rule{Resource: "r", Threshold: 1}, c503: true, want: 429},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := stattest.NewClock(0)
			eng := engine(t, clock, tc.rule)
			b := refuse(t, eng, clock, tc.conc, tc.after)

			var opts []Option
			if tc.c503 {
				opts = append(opts, WithConcurrency503())
			}
			rec := httptest.NewRecorder()
			New(eng, opts...).defaultBlock(rec, httptest.NewRequest(http.MethodGet, "/", nil), b)

			status, fields := RefusalFields(b, tc.c503)
			assert.Equal(t, tc.want, status)
			assert.Equal(t, rec.Code, status)
			want := http.Header{}
			for _, f := range fields {
				want.Set(f[0], f[1])
			}
			got := rec.Header().Clone()
			got.Del("Content-Type")
			got.Del("X-Content-Type-Options")
			assert.Equal(t, want, got)
			if tc.rule.Metric != flow.Concurrency {
				assert.NotEmpty(t, got.Get("RateLimit"), "a rate rule's refusal has its fields")
			}
		})
	}
}

// refuse returns the Refusal of a request eng blocks on resource "r".
func refuse(t *testing.T, eng *flow.Engine, clock *stattest.Clock, conc bool, after time.Duration) Blocked {
	t.Helper()
	if conc {
		held, err := eng.Entry("r")
		require.NoError(t, err)
		defer held.Exit(nil)
	}
	var be *flow.BlockError
	for range 100 {
		en, err := eng.Entry("r")
		if errors.As(err, &be) {
			return en.Refusal()
		}
		require.NoError(t, err)
		en.Exit(nil)
		clock.Advance(after)
		after = 0
	}
	t.Fatal("no request was refused")
	return Blocked{}
}

// TestRefusalFieldsOfNoRefusal: the zero Refusal has no rule to describe.
func TestRefusalFieldsOfNoRefusal(t *testing.T) {
	status, fields := RefusalFields(Blocked{RetryAfter: -1}, true)
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Empty(t, fields)
}
