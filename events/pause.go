package events

import "time"

// Pause is an event type an operator paused: the relay claims none of its
// events until the type is resumed. They stay NEW, count no attempt, and
// with per-aggregate ordering each one holds the later events of its
// aggregate, whatever their type, as a FAILED event does.
type Pause struct {
	// Type is the paused event type (the routing key).
	Type string `bson:"_id" json:"type"`
	// By is who paused it, Reason why, At when (the database's time).
	By     string    `bson:"by" json:"by"`
	Reason string    `bson:"reason" json:"reason"`
	At     time.Time `bson:"at" json:"at"`
}
