// Package claim is the relay's hot path: claim a batch of NEW events,
// publish them with confirms, and write each outcome: PUBLISHED, back to NEW
// for a retry, or FAILED.
//
// A worker claims only in the partitions it owns (Config.Owner, see package
// ownership), so replicas never race for an event. It tells the owner of
// a claim write that failed (Owner.Wrote): one that may still land keeps
// its partitions from being given away meanwhile, and one the database's
// fence refused drops its partition. With ordering on (the
// default) the claim leaves out every aggregate that is held (an event of
// it in flight, backing off, or FAILED), and a batch is published in
// rounds, the r-th event of every aggregate in round r, so that no event
// reaches the broker before the earlier events of its aggregate are
// confirmed; an event that is not confirmed holds back the rest of its
// aggregate in the batch.
//
// A batch costs a few database commands whatever its size, a few finds
// more when ordered, plus one per kind of failure: docs/design.md counts
// them (Database commands per batch). Every write after the claim is
// fenced by the lease, so a worker that lost its claim to recovery changes
// nothing.
//
// With a tracer provider that records (Config.Tracer), each message is
// published in a span of its own linked to its event's stored trace
// context (also its child with Config.TraceParent), and keeps carrying
// that context unless Config.TraceMessage says to carry the span's;
// claims and settles get INTERNAL spans linked to their events. trace.go has the names; docs/message-contract.md (Spans) the
// reference. With the default no-op provider none is started.
package claim
