package window

import "fmt"

// Event is a kind of count kept per bucket.
type Event uint8

// The events a bucket counts.
const (
	// Pass counts admitted requests (and folded-in borrowed ones).
	Pass Event = iota
	// Block counts refused requests.
	Block
	// Success counts completed requests.
	Success
	// Exception counts completed requests that failed.
	Exception
	// RT sums response times (in the caller's unit; flow uses nanoseconds).
	RT
	// OccupiedPass counts requests admitted against a future bucket; they are
	// also counted as Pass when their bucket becomes current.
	OccupiedPass

	numEvents
)

var eventNames = [numEvents]string{"pass", "block", "success", "exception", "rt", "occupied_pass"}

func (e Event) String() string {
	if e < numEvents {
		return eventNames[e]
	}
	return fmt.Sprintf("Event(%d)", uint8(e))
}

// Events lists every event, in order.
func Events() []Event {
	return []Event{Pass, Block, Success, Exception, RT, OccupiedPass}
}
