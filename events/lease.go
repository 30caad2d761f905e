package events

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Lease is one claim of a batch of events by one worker. Every write after
// the claim is conditional on the document still carrying this lease's
// worker id and token, so a worker whose claim was recovered and handed to
// another can never overwrite the new owner's state (fencing). The token
// tells two claims by the same worker apart.
type Lease struct {
	WorkerID string
	Token    string
	At       time.Time
}

// Claimed is one event document a worker holds a lease on.
type Claimed struct {
	// ID is the document's _id, used by every write that follows.
	ID any
	// Attempts counts the claims of this event, this one included.
	Attempts int
	// Doc is the document as read when it was claimed.
	Doc bson.Raw
}

// Release moves claimed events out of PROCESSING without publishing them:
// back to NEW (to be retried) or on to FAILED (for an operator).
type Release struct {
	IDs    []any
	Status Status // StatusNew or StatusFailed
	// LastError says why; kept on the document for operators.
	LastError string
	// RetryAt delays the next claim of a NEW event; zero means at once.
	RetryAt time.Time
	// Refund takes back the attempt the claim counted, because the failure
	// was not the event's (broker outage, shutdown).
	Refund bool
	// Attempt, when not nil, is added to each event's attempt history
	// (FieldAttemptErrors). A release that refunds the attempt has none.
	Attempt *AttemptError
}

// ClaimLimit bounds one claim.
type ClaimLimit struct {
	// Events is the most events one claim takes.
	Events int
	// Bytes bounds the sum of the raw sizes of the documents one claim
	// takes: a document that would take the sum past it is left for the
	// next claim, except the first, which is taken whatever its size.
	// Zero means no bound.
	Bytes int
	// Owned, when not nil, limits the claim to the events of the
	// partitions it marks true (see Partition); it has Partitions entries.
	// nil means every partition.
	Owned []bool
	// Tenures, when not nil, is the ownership tenure this claim holds
	// each partition of Owned under (Partitions entries): the term its
	// owner's unbroken ownership began with, which only grows from one
	// owner to the next. Where the deployment has transactions, the store
	// checks it on the server in the claim's write, and refuses the claim
	// of an owner whose tenure has passed (ErrFenced). nil claims without
	// that check.
	Tenures []int64
	// Ordered claims in order per aggregate: an event whose ordering key
	// is held (see Held) is not claimed, nor is any later event of its key.
	Ordered bool
	// FailedHolds makes a FAILED event that was not skipped hold its key
	// (OUTBOX_ORDERING_AFTER_FAILED=wait). Only with Ordered.
	FailedHolds bool
	// Held are ordering keys the claim must treat as held whatever the
	// outbox says: those of a claim whose write failed and may still be
	// landing on the server. Its events can turn PROCESSING after the
	// next claim read which keys are held, and a later event of theirs
	// must not be claimed meanwhile. Only with Ordered.
	Held map[string]bool
	// Draining says the last claim stopped at a bound: the head most
	// likely has more, so an ordered claim need not first check that it
	// has anything (a store may skip such a probe).
	Draining bool
}

// ErrFenced is a claim's error when the database refused it because
// another worker holds one of its partitions under a later tenure (see
// ClaimLimit.Tenures): nothing of the refused write was committed. The
// claimer treats it as a partition lost, not as a failure.
var ErrFenced = errors.New("the database's fence refused the claim: another worker holds the partition under a later tenure")

// FencedError is ErrFenced with what the fence said: the tenure each
// refused partition's fence holds. The claimer hands it to the ownership,
// which drops those partitions and numbers its next term of each above
// the fence (a dropped owners collection restarts the terms below it).
type FencedError struct {
	// Fences maps each refused partition to its fence's tenure.
	Fences map[int]int64
}

func (e *FencedError) Error() string {
	ps := make([]int, 0, len(e.Fences))
	for p := range e.Fences {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return fmt.Sprintf("partitions %v: %s", ps, ErrFenced)
}

// Is makes a FencedError match ErrFenced.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// Held is the rule of ordered claiming: an ordering key is held while one
// of its events is PROCESSING, NEW with a retryAt still to come (backing
// off), or FAILED without skippedAt when failedHolds. No event of a held
// key is claimed; everything else flows.
func Held(status Status, retryAt time.Time, skipped bool, now time.Time, failedHolds bool) bool {
	switch status {
	case StatusProcessing:
		return true
	case StatusNew:
		return retryAt.After(now)
	case StatusFailed:
		return failedHolds && !skipped
	}
	return false
}

// ClaimResult is what one claim did.
type ClaimResult struct {
	// Claimed are the events this lease now holds.
	Claimed []Claimed
	// Rejected are events the claim read but did not claim, because a
	// claim cannot be written to them (see CheckManaged and CheckSize) or
	// the server refused it: each was written FAILED at once, or says why
	// it could not be.
	Rejected []Rejected
	// More reports that the claim stopped at a bound of its ClaimLimit,
	// so more may be waiting: true even when other workers won part of
	// what it read, so that the loser of a race claims again at once.
	More bool
}

// Rejected is one event a claim refused.
type Rejected struct {
	ID any
	// LastError is why, as written to the event.
	LastError string
	// Err is nil when the event was written FAILED. Otherwise it says why
	// that write failed; the event is still NEW and the next claim tries
	// again, unless Skipped.
	Err error
	// Skipped reports an event that cannot be written at all (it is too
	// close to the document size limit to take even its status change):
	// this store leaves it out of its claims from now on.
	Skipped bool
}
