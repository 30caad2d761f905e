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
// counts): past it, further events whose publish timed out are not
// remembered; they are retried as usual and may become suspects later.
const suspectsMax = 10000

// errPublishedAlone stands, while the rest of a batch is published, for the
// result of its suspect, which was published alone first: the batch's
// publish leaves it alone (and, in order, holds back the later events of
// its key to the next run).
var errPublishedAlone = errors.New("published alone before its batch")

// errTimedOutAlone wraps the last timeout of an event that has now timed out
// TimeoutsAloneMax times published alone: it becomes FAILED, reason timeout.
var errTimedOutAlone = errors.New("publish timed out with the message published alone")

// timeouts finds the messages whose publish times out on their own
// account. A publish that times out with several messages in flight says
// nothing about any one of them, so each of its unconfirmed events becomes
// a suspect, and the next run that claims a suspect publishes it alone,
// first, with the whole publish timeout to itself, then the rest of its
// batch with the time left. A suspect confirmed (or otherwise answered by
// the broker) is cleared; one that times out alone TimeoutsAloneMax times
// fails (errTimedOutAlone). The counts live in memory: a restart, or the
// event's partition moving to another replica, starts them afresh, which
// only delays the failure.
type timeouts struct {
	mu sync.Mutex
	// suspects maps a suspect's message id to the times it has timed out
	// published alone.
	suspects map[string]int
}

// isolate chooses the suspect a run publishes alone, first: the first
// suspect of the batch (claimed, in publish order, with its messages and
// outcomes) that may go first, which in ordered mode is the first event of
// its ordering key in the batch. It returns its index, or -1.
func (t *timeouts) isolate(claimed []events.Claimed, msgs []*events.Message, outcomes []outcome, ordered bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.suspects) == 0 {
		return -1
	}
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
			return i
		}
	}
	return -1
}

// note learns from a run's results, after its publish. alone is the index
// of the event published alone first (isolate), or -1; a run that handed
// the broker only one message at all published it alone too. timedOut
// reports that the run's publish timeout passed (not a shutdown). An event
// published alone that got no confirm counts a timeout, and fails at
// TimeoutsAloneMax; the other unconfirmed events become suspects. An event
// the broker answered is cleared.
func (t *timeouts) note(msgs []*events.Message, outcomes []outcome, alone int, timedOut bool) {
	if alone < 0 {
		sent, last := 0, -1
		for i, o := range outcomes {
			if msgs[i] != nil && !errors.Is(o.err, errHeldBack) && !isInvalid(o.err) {
				sent, last = sent+1, i
			}
		}
		if sent == 1 {
			alone = last
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
		case i == alone:
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
