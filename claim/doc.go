// Package claim is the relay's hot path: claim a batch of NEW events,
// publish them with confirms, and write each outcome: PUBLISHED, back to NEW
// for a retry, or FAILED.
//
// A worker claims only in the partitions it owns (Config.Owner, see package
// ownership), so replicas never race for an event. With ordering on (the
// default) the claim leaves out every aggregate that is held (an event of
// it in flight, backing off, or FAILED), and a batch is published in
// rounds, the r-th event of every aggregate in round r, so that no event
// reaches the broker before the earlier events of its aggregate are
// confirmed; an event that is not confirmed holds back the rest of its
// aggregate in the batch.
//
// One claim costs four database commands on MongoDB whatever the batch
// size (two finds, claim, mark; three on FerretDB), four finds more when
// ordered (a probe and the held aggregates; an idle tick costs the probe
// only), plus one per kind of failure. Every write after the claim is
// fenced by the lease, so a worker that lost its claim to recovery changes
// nothing.
package claim
