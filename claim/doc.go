// Package claim is the relay's hot path: claim a batch of NEW events,
// publish them with confirms, and write each outcome: PUBLISHED, back to NEW
// for a retry, or FAILED.
//
// One claim costs three database commands whatever the batch size (find,
// claim, mark) plus one per kind of failure, and the publishes of a batch
// are pipelined. Every write after the claim is fenced by the lease, so a
// worker that lost its claim to recovery changes nothing.
package claim
