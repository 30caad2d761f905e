package claim

import (
	"errors"
	"fmt"
	"sync"

	"github.com/outboxrelay/outbox/events"
)

// TimeoutsAloneMax is how many times an event's publish may time out while
// it is the only message of its run (published alone, with the whole
// PublishTimeout to itself) before it becomes FAILED with reason timeout.
// A message the broker cannot take within the publish timeout (a body too
// large for the link, a queue that never confirms it) would otherwise be
// refunded and retried for ever, and hold its aggregate and its batch with
// it. More than one, so that a broker that stalled once does not fail an
// event: at the default PublishTimeout the relay gives such a message a
// minute and a half in all.
const TimeoutsAloneMax = 3

// suspectsMax bounds the events a claimer remembers as suspects (and their
// counts): a broker that stalled under a large backlog leaves at most this
// many to publish alone, one per run; the others are published as usual,
// and become suspects again if they time out again.
const suspectsMax = 10000

// errSetAside is the outcome of the events of a run that publishes a
// suspect alone: not published, back to NEW with the attempt refunded, to
// be claimed again at once.
var errSetAside = errors.New("set aside: this run published alone an event whose publish had timed out")

// errTimedOutAlone wraps the last timeout of an event that has now timed out
// TimeoutsAloneMax times published alone: it becomes FAILED, reason timeout.
var errTimedOutAlone = errors.New("publish timed out with the message published alone")

// timeouts finds the messages whose publish times out on their own
// account. A publish that times out with several messages in flight says
// nothing about any one of them, so each of its unconfirmed events becomes
// a suspect, and the next run that claims a suspect publishes it alone,
// with the publish timeout to itself, and sets the rest of its batch
// aside. A suspect confirmed alone is cleared; one that times out alone
// TimeoutsAloneMax times fails (errTimedOutAlone). The counts live in
// memory: a restart, or the event's partition moving to another replica,
// starts them afresh, which only delays the failure.
type timeouts struct {
	mu sync.Mutex
	// suspects maps a suspect's message id to the times it has timed out
	// published alone.
	suspects map[string]int
}

// isolate chooses the suspect a run publishes alone, if the batch
// (claimed, in publish order, with its messages and outcomes) holds one
// that may go first: in ordered mode, the first event of its ordering key
// in the batch. Every other event of the batch is set aside. It returns
// whether it did.
func (t *timeouts) isolate(claimed []events.Claimed, msgs []*events.Message, outcomes []outcome, ordered bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.suspects) == 0 {
		return false
	}
	chosen := -1
	seen := map[string]bool{}
	for i, m := range msgs {
		key, keyed := "", false
		if ordered {
			key, keyed = events.OrderingKey(claimed[i].Doc)
		}
		first := !keyed || !seen[key]
		if keyed {
			seen[key] = true
		}
		if m == nil || outcomes[i].err != nil || !first {
			continue
		}
		if _, ok := t.suspects[m.ID]; ok {
			chosen = i
			break
		}
	}
	if chosen < 0 {
		return false
	}
	for i := range outcomes {
		if i != chosen && outcomes[i].err == nil {
			outcomes[i].err = errSetAside
		}
	}
	return true
}

// note learns from a run's results, after its publish. timedOut reports
// that the run's publish timeout passed (not a shutdown). A run that
// handed the broker one message alone and got no confirm counts a timeout
// against it, and fails it at TimeoutsAloneMax; a run of several makes its
// unconfirmed messages suspects. A confirmed suspect is cleared.
func (t *timeouts) note(msgs []*events.Message, outcomes []outcome, timedOut bool) {
	sent := 0
	for i, o := range outcomes {
		if msgs[i] != nil && !errors.Is(o.err, errSetAside) && !errors.Is(o.err, errHeldBack) && !isInvalid(o.err) {
			sent++
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.suspects == nil {
		t.suspects = map[string]int{}
	}
	for i := range outcomes {
		m, o := msgs[i], &outcomes[i]
		if m == nil {
			continue
		}
		switch {
		case o.err == nil || errors.Is(o.err, events.ErrNacked) || errors.Is(o.err, events.ErrReturned) ||
			errors.Is(o.err, events.ErrRejected) || isInvalid(o.err):
			// An answer from the broker, or no message at all: not a
			// timeout suspect.
			delete(t.suspects, m.ID)
		case !errors.Is(o.err, events.ErrUnconfirmed) || !timedOut:
		case sent == 1:
			n := t.suspects[m.ID] + 1
			if n >= TimeoutsAloneMax {
				delete(t.suspects, m.ID)
				o.err = fmt.Errorf("%w %d times (OUTBOX_PUBLISH_TIMEOUT each): %w", errTimedOutAlone, n, o.err)
				continue
			}
			t.suspect(m.ID, n)
		default:
			if _, ok := t.suspects[m.ID]; !ok {
				t.suspect(m.ID, 0)
			}
		}
	}
}

// suspect records id with count n, within suspectsMax.
func (t *timeouts) suspect(id string, n int) {
	if _, ok := t.suspects[id]; !ok && len(t.suspects) >= suspectsMax {
		return
	}
	t.suspects[id] = n
}

func isInvalid(err error) bool {
	var invalid *events.InvalidError
	return errors.As(err, &invalid)
}
