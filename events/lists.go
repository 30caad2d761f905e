package events

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The lists of the console's incident pages that its sampler keeps
// current on a schedule, so that a view reads none of the events they
// come from: the failure groups and the holders of held aggregates.

// FailureGroup is the FAILED events, not skipped, that failed the same
// way: the same stored cause (FieldFailureCause) and reason of their last
// attempt (FieldFailureReason).
type FailureGroup struct {
	Reason string `json:"reason"`
	// Cause is lastError with its ids, numbers and quoted values
	// replaced (Cause), so that events that failed the same way group
	// together.
	Cause string `json:"cause"`
	Count int    `json:"count"`
	// Unclassified counts the events whose cause is not stored yet:
	// grouped by the cause computed for them, they are not chosen by the
	// group's link or action until it is stored.
	Unclassified int `json:"unclassified,omitempty"`
	// Example is the newest event of the group, its _id as text.
	Example string    `json:"exampleId"`
	Latest  time.Time `json:"latest,omitzero"`
}

// FailureGroups is the FAILED events, not skipped, grouped by cause,
// largest group first, as read at At.
type FailureGroups struct {
	// At is when they were read, by the database's clock; zero where
	// the reader does not say.
	At     time.Time      `json:"at,omitzero"`
	Groups []FailureGroup `json:"groups"`
	// Read counts the FAILED events grouped: the newest, up to a bound;
	// Capped says there were more.
	Read   int  `json:"read"`
	Capped bool `json:"capped,omitempty"`
	// Newest are the newest FAILED events of the same read, skipped
	// ones too, as read, newest first, for the first page of the FAILED
	// list; NewestAll says they are every FAILED event there was.
	Newest    []bson.Raw `json:"-"`
	NewestAll bool       `json:"-"`
}

// Holder is an event that holds its aggregate: FAILED and not skipped
// (where FAILED holds), NEW and backing off before a retry, or NEW and of
// a paused type.
type Holder struct {
	Key string   // the ordering key (OrderingKey)
	Doc bson.Raw // the holder, projected
}

// Holders is the holders of held aggregates as read at At, each
// aggregate once, under its oldest holder.
type Holders struct {
	At   time.Time
	List []Holder
	// Capped says there were more than List.
	Capped bool
}
