package events

import (
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
}
