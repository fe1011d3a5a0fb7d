package rulefile_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/rulefile"
)

// blockingRead is what a configuration store's client offers: Consul's
// KV get with a WaitIndex, Apollo's long poll of notifications, Nacos'
// listener. It returns the value and its version once the version is
// past after (or a timeout passes: then the same version).
type blockingRead func(ctx context.Context, after uint64) (value []byte, version uint64, err error)

// storeSource is a rulefile.Source over such a store: the pattern of
// every source (see docs/sources.md).
type storeSource struct {
	key  string
	read blockingRead
}

func (s *storeSource) Run(ctx context.Context, update func([]flow.Rule, error)) {
	var seen uint64 // the version last read: the next read waits past it
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		value, version, err := s.read(ctx, seen)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// The store is unreachable: the rules in force stay; retry,
			// backing off.
			update(nil, fmt.Errorf("rules at %s: %w", s.key, err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 5*time.Second)
			continue
		case version == seen:
			continue // a long poll's timeout: nothing changed
		}
		wait, seen = 100*time.Millisecond, version
		// Parse and check as a file is (bounded; errors name the key and
		// the line): update applies the rules whole, or reports the error.
		update(rulefile.Check(s.key, value))
	}
}

// A source over a store with blocking reads: each new version is parsed
// as a rule file and applied whole; a bad one keeps the rules in force.
func Example_writingASource() {
	versions := []string{
		"rules:\n  - {id: api, resource: api, threshold: 10}\n",
		"rules:\n  - {id: api, resource: api, treshold: 20}\n", // a typo: refused
		"rules:\n  - {id: api, resource: api, threshold: 20}\n",
	}
	next := make(chan struct{})
	read := func(ctx context.Context, after uint64) ([]byte, uint64, error) {
		if after >= uint64(len(versions)) {
			<-ctx.Done()
			return nil, after, ctx.Err()
		}
		if after > 0 {
			<-next // the store changes when the example says so
		}
		return []byte(versions[after]), after + 1, nil
	}
	eng, _ := flow.New()
	sync := rulefile.Start(eng, &storeSource{key: "config/leapflow", read: read},
		rulefile.WithLogger(slog.New(slog.DiscardHandler)))
	waitFor := func(reloads int64, failed bool) {
		for sync.Reloads() != reloads || (sync.LastError() != nil) != failed {
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(1, false)
	fmt.Println(eng.Rules()[0].Threshold)
	next <- struct{}{}
	waitFor(1, true)
	fmt.Println(eng.Rules()[0].Threshold, sync.LastError())
	next <- struct{}{}
	waitFor(2, false)
	fmt.Println(eng.Rules()[0].Threshold)
	sync.Stop()
	// Output:
	// 10
	// 10 config/leapflow:2:30: rule #0: unknown field "treshold"
	// 20
}
