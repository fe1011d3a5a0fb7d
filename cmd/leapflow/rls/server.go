// Package rls is a rate limit service speaking Envoy's RLS v3
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), deciding
// with a flow.Engine: gateways (Envoy, Istio, Envoy Gateway) get sliding
// windows, GCRA, per-value limits and Redis leases by pointing at it.
//
// Limits come from envoyproxy/ratelimit's configuration (LoadConfig: a
// domain and a descriptor tree per file; see Config.Rules for how each
// limit maps to a rule), from leapflow rule files (Server.Load's own
// rules: a request descriptor of domain d and entries k1=v1, k2=v2 is
// resource "d/k1/k2" with key "v1/v2"; see Resource), or both.
//
// A request descriptor matches a limit as in envoyproxy/ratelimit: its
// entries walk the domain's tree from the root, each taking the child of
// its key and value, else the child of its key alone (a wildcard); the
// node reached by the last entry holds the limit. Each descriptor is
// decided on its own (every matching one counts the request, as the
// peer's INCRBY does); the answer is OVER_LIMIT when any is.
package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leapflow/leapflow/flow"
)

// The bounds on a request: a descriptor list longer, or an entry longer,
// is refused with InvalidArgument naming it.
const (
	// MaxRequestDescriptors is the most descriptors a request may carry.
	MaxRequestDescriptors = 64
	// MaxHits is the largest hits_addend.
	MaxHits = 1 << 30
)

// Server answers ShouldRateLimit. It is safe for simultaneous use; Load
// replaces what it enforces while it serves.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	eng  *flow.Engine
	opts Options
	mu   sync.Mutex // serialises Load
	cur  atomic.Pointer[loaded]
	// decisions counts the descriptors that matched a limit, overLimit
	// those answered OVER_LIMIT. (What shadow-mode limits would have
	// refused is the engine's DryRuns, which promflow exports.)
	overLimit, decisions atomic.Int64
}

// loaded is what a Load put in force.
type loaded struct {
	cfg *Config
	own map[string]bool // the resources of the leapflow rules
	// names are the configuration's limit names by resource, for the
	// RateLimit header fields.
	names map[string]string
}

// New returns a server deciding with eng, which it loads its rules into
// (any rules eng had are replaced at the first Load).
func New(eng *flow.Engine, opts Options) *Server {
	if opts.LocalShare == 0 {
		opts.LocalShare = 1
	}
	s := &Server{eng: eng, opts: opts}
	s.cur.Store(&loaded{cfg: &Config{domains: map[string]*node{}}, own: map[string]bool{}})
	return s
}

// Load puts cfg (nil: none) and own, leapflow rules, in force together:
// on any error nothing changes (the last good configuration stays).
func (s *Server) Load(cfg *Config, own []flow.Rule) error {
	if cfg == nil {
		cfg = &Config{domains: map[string]*node{}}
	}
	if err := checkOwnRules(own); err != nil {
		return err
	}
	rules, err := cfg.Rules(s.opts)
	if err != nil {
		return err
	}
	ownSet := make(map[string]bool, len(own))
	for _, r := range own {
		ownSet[r.Resource] = true
	}
	for _, r := range rules {
		if ownSet[r.Resource] {
			return fmt.Errorf("rls: resource %q has rules in both the descriptor configuration and the rule files", r.Resource)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.eng.LoadRules(append(rules, own...)); err != nil {
		return err
	}
	names := make(map[string]string, len(cfg.limits))
	for _, n := range cfg.limits {
		if n.limit.Name != "" {
			names[n.path] = n.limit.Name
		}
	}
	s.cur.Store(&loaded{cfg: cfg, own: ownSet, names: names})
	return nil
}

// Stats are the server's counts since it started.
type Stats struct {
	// Decisions is the descriptors that matched a limit, OverLimit those
	// answered OVER_LIMIT.
	Decisions, OverLimit int64
}

// Stats returns the server's counts.
func (s *Server) Stats() Stats {
	return Stats{Decisions: s.decisions.Load(), OverLimit: s.overLimit.Load()}
}

// Resource is the resource and key a request descriptor of domain names
// under leapflow rule files: resource domain/k1/k2..., key v1/v2... ('/',
// '=' and '\' in keys and values escaped with '\'; a single value is the
// key as it is).
func Resource(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry) (resource, key string) {
	var r, k strings.Builder
	r.WriteString(domain)
	for i, e := range entries {
		r.WriteByte('/')
		r.WriteString(escape(e.GetKey()))
		if i > 0 {
			k.WriteByte('/')
		}
		if len(entries) == 1 {
			k.WriteString(e.GetValue())
		} else {
			k.WriteString(escape(e.GetValue()))
		}
	}
	return r.String(), k.String()
}

// decision is one descriptor's: where it counts and what the answer says.
type decision struct {
	resource, key string
	perKey        bool
	limit         *Limit // nil: read from the rule (leapflow rules)
}

// match finds what descriptor d of domain counts against; false when no
// limit applies (unknown domain, no matching node, an unlimited one).
func (l *loaded) match(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry) (decision, bool) {
	if root := l.cfg.domains[domain]; root != nil {
		n := root
		var keys []string
		for _, e := range entries {
			var next *node
			if vals := n.exact[e.GetKey()]; vals != nil {
				next = vals[e.GetValue()]
			}
			if next == nil {
				if next = n.any[e.GetKey()]; next != nil {
					keys = append(keys, e.GetValue())
				}
			}
			if next == nil {
				n = nil
				break
			}
			n = next
		}
		if n != nil && n != root {
			if n.unlimited || n.limit == nil {
				return decision{}, false
			}
			d := decision{resource: n.path, perKey: n.perKey, limit: n.limit}
			if len(keys) == 1 {
				d.key = keys[0]
			} else {
				for i, k := range keys {
					if i > 0 {
						d.key += "/"
					}
					d.key += escape(k)
				}
			}
			return d, true
		}
	}
	if len(l.own) == 0 {
		return decision{}, false
	}
	res, key := Resource(domain, entries)
	if !l.own[res] {
		return decision{}, false
	}
	return decision{resource: res, key: key, perKey: true}, true
}

// ShouldRateLimit decides a request's descriptors.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	l := s.cur.Load()
	hits := uint64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1 // a request-level 0 counts one
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	head := headerPick{names: l.names}
	for i, d := range req.Descriptors {
		n := hits
		if h := d.GetHitsAddend(); h != nil {
			n = h.GetValue() // an explicit 0 reads without counting
		}
		st, over, err := s.decide(l, req.Domain, d.Entries, n, &head)
		if err != nil {
			return nil, err
		}
		resp.Statuses[i] = st
		if over {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if s.opts.Headers {
		resp.ResponseHeadersToAdd = head.headers(resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	return resp, nil
}

// decide counts n on what the descriptor matches and returns its status.
func (s *Server) decide(l *loaded, domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, n uint64, head *headerPick) (*rlsv3.RateLimitResponse_DescriptorStatus, bool, error) {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	d, ok := l.match(domain, entries)
	if !ok {
		return st, false, nil
	}
	s.decisions.Add(1)
	var opts [2]flow.EntryOption
	o := opts[:0]
	if d.perKey {
		o = append(o, flow.WithKey(d.key))
	}
	if d.limit != nil {
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: d.limit.Name, RequestsPerUnit: uint32(d.limit.RequestsPerUnit), Unit: protoUnit(d.limit.Unit)}
	}
	if n == 0 {
		s.fillLeft(st, &d, o, head)
		return st, false, nil
	}
	rf, err := s.eng.Allow(d.resource, append(o, flow.WithCount(int(n)))...)
	if err != nil {
		var be *flow.BlockError
		if !errors.As(err, &be) {
			return nil, false, status.Errorf(codes.Internal, "deciding %s: %v", d.resource, err)
		}
		s.overLimit.Add(1)
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		if st.CurrentLimit == nil {
			st.CurrentLimit = ruleLimit(rf.Err)
		}
		st.LimitRemaining = clampU32(rf.Remaining)
		if rf.Reset >= 0 {
			st.DurationUntilReset = durationpb.New(rf.Reset)
		}
		head.refused(rf, st)
		return st, true, nil
	}
	s.fillLeft(st, &d, o, head)
	return st, false, nil
}

// fillLeft fills st with what the descriptor's rules have left (nothing
// when flow cannot read it without counting: Global and dry-run rules).
func (s *Server) fillLeft(st *rlsv3.RateLimitResponse_DescriptorStatus, d *decision, o []flow.EntryOption, head *headerPick) {
	left, ok := s.eng.Left(d.resource, o...)
	if !ok {
		return
	}
	if st.CurrentLimit == nil {
		st.CurrentLimit = ruleLimit(left.Err)
	}
	st.LimitRemaining = clampU32(left.Remaining)
	st.DurationUntilReset = durationpb.New(left.Reset)
	head.left(left, st)
}

// ruleLimit is the current_limit of a leapflow rule: its quota per its
// window, in the unit the window is (UNKNOWN for another window).
func ruleLimit(be *flow.BlockError) *rlsv3.RateLimitResponse_RateLimit {
	if be == nil {
		return nil
	}
	q, w := be.Quota()
	u := rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	switch w {
	case time.Second:
		u = rlsv3.RateLimitResponse_RateLimit_SECOND
	case time.Minute:
		u = rlsv3.RateLimitResponse_RateLimit_MINUTE
	case time.Hour:
		u = rlsv3.RateLimitResponse_RateLimit_HOUR
	case 24 * time.Hour:
		u = rlsv3.RateLimitResponse_RateLimit_DAY
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: be.Rule.ID, RequestsPerUnit: clampU32(q), Unit: u}
}

func protoUnit(u Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch u {
	case Second:
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case Minute:
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case Hour:
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case Day:
		return rlsv3.RateLimitResponse_RateLimit_DAY
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

func clampU32(n int64) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }

// validate refuses a request over the bounds, naming the field.
func validate(req *rlsv3.RateLimitRequest) error {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, format, args...)
	}
	switch {
	case req.GetDomain() == "":
		return bad("domain: must not be empty")
	case len(req.GetDomain()) > maxEntryLen:
		return bad("domain: longer than %d bytes", maxEntryLen)
	case len(req.GetDescriptors()) == 0:
		return bad("descriptors: must not be empty")
	case len(req.GetDescriptors()) > MaxRequestDescriptors:
		return bad("descriptors: %d, more than %d", len(req.GetDescriptors()), MaxRequestDescriptors)
	case req.GetHitsAddend() > MaxHits:
		return bad("hits_addend: %d, more than %d", req.GetHitsAddend(), MaxHits)
	}
	for i, d := range req.GetDescriptors() {
		switch {
		case d == nil || len(d.GetEntries()) == 0:
			return bad("descriptors[%d].entries: must not be empty", i)
		case len(d.GetEntries()) > MaxDepth:
			return bad("descriptors[%d].entries: %d, more than %d", i, len(d.GetEntries()), MaxDepth)
		case d.GetLimit() != nil:
			return bad("descriptors[%d].limit: limit overrides are not supported (configure the limit)", i)
		case d.GetIsNegativeHits():
			return bad("descriptors[%d].is_negative_hits: not supported", i)
		case d.GetHitsAddend() != nil && d.GetHitsAddend().GetValue() > MaxHits:
			return bad("descriptors[%d].hits_addend: %d, more than %d", i, d.GetHitsAddend().GetValue(), MaxHits)
		}
		for j, e := range d.GetEntries() {
			switch {
			case e.GetKey() == "":
				return bad("descriptors[%d].entries[%d].key: must not be empty", i, j)
			case len(e.GetKey()) > maxEntryLen:
				return bad("descriptors[%d].entries[%d].key: longer than %d bytes", i, j, maxEntryLen)
			case len(e.GetValue()) > maxEntryLen:
				return bad("descriptors[%d].entries[%d].value: longer than %d bytes", i, j, maxEntryLen)
			}
		}
	}
	return nil
}

// headerPick picks the descriptor the RateLimit fields describe: the one
// with the least left, and the longest Retry-After among those refused.
type headerPick struct {
	names     map[string]string // limit names by resource
	have      bool
	name      string
	quota     int64
	window    time.Duration
	remaining int64
	reset     time.Duration
	retry     time.Duration
}

func (h *headerPick) consider(be *flow.BlockError, remaining int64, reset time.Duration) {
	if be == nil {
		return
	}
	q, w := be.Quota()
	if w <= 0 || h.have && remaining >= h.remaining {
		return
	}
	name := be.Rule.ID
	if n, ok := h.names[be.Rule.Resource]; ok {
		name = n
	} else if name == "" {
		name = be.Rule.Resource
	}
	*h = headerPick{names: h.names, have: true, name: name, quota: q, window: w, remaining: remaining, reset: reset, retry: h.retry}
}

func (h *headerPick) left(l flow.Left, _ *rlsv3.RateLimitResponse_DescriptorStatus) {
	h.consider(l.Err, l.Remaining, l.Reset)
}

func (h *headerPick) refused(rf flow.Refusal, _ *rlsv3.RateLimitResponse_DescriptorStatus) {
	h.consider(rf.Err, rf.Remaining, rf.Reset)
	if rf.RetryAfter > h.retry {
		h.retry = rf.RetryAfter
	}
}

// headers are the fields of the IETF draft (RateLimit-Policy, RateLimit)
// and Retry-After when over the limit, as httpflow writes them.
func (h *headerPick) headers(over bool) []*corev3.HeaderValue {
	var out []*corev3.HeaderValue
	if h.have {
		name := strconv.Quote(strings.ToValidUTF8(h.name, "?"))
		secs := func(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }
		out = append(out,
			&corev3.HeaderValue{Key: "RateLimit-Policy", Value: fmt.Sprintf("%s;q=%d;w=%d", name, h.quota, max(secs(h.window), 1))},
			&corev3.HeaderValue{Key: "RateLimit", Value: fmt.Sprintf("%s;r=%d;t=%d", name, max(h.remaining, 0), max(secs(h.reset), 0))})
	}
	if over && h.retry > 0 {
		out = append(out, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(max(int64(math.Ceil(h.retry.Seconds())), 1), 10)})
	}
	return out
}
