package httpflow

import (
	"net/http"
	"strconv"

	"github.com/leapflow/leapflow/flow"
)

// RefusalFields returns the status and the header fields (name, value) the
// default block handler answers b with: 429 Too Many Requests, or 503
// Service Unavailable for a circuit breaker's refusal (flow.ReasonBreaker:
// the service behind is failing, not the caller too fast), and for a
// Concurrency rule's when concurrency503; Retry-After when the rule can
// say (a breaker: until its next probe); RateLimit-Policy and
// RateLimit when it has a quota (see the package doc). It is for adapters
// of servers that are not net/http, so that their answers carry the same
// fields; names are as the drafts spell them, values ready to send.
func RefusalFields(b Blocked, concurrency503 bool) (status int, fields [][2]string) {
	fields = make([][2]string, 0, 3)
	if b.RetryAfter >= 0 {
		// At least a second: the field has no smaller unit, and 0 would
		// send the client straight back into the same window.
		fields = append(fields, [2]string{"Retry-After", strconv.FormatInt(max(ceilSeconds(b.RetryAfter), 1), 10)})
	}
	status = http.StatusTooManyRequests
	if b.Err == nil {
		return status, fields
	}
	if quota, window := b.Err.Quota(); window > 0 {
		name := policyName(b.Err)
		q, win := policyQuota(quota, window)
		field := name + ";r=" + strconv.FormatInt(min(b.Remaining, q), 10)
		if b.Reset >= 0 {
			field += ";t=" + strconv.FormatInt(ceilSeconds(b.Reset), 10)
		}
		fields = append(fields,
			[2]string{"RateLimit-Policy", policyField(name, q, win)},
			[2]string{"RateLimit", field})
	}
	if b.Err.Reason == flow.ReasonBreaker || concurrency503 && b.Err.Reason == flow.ReasonConcurrency {
		status = http.StatusServiceUnavailable
	}
	return status, fields
}
