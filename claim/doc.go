// Package claim is the relay's hot path: claim a batch of NEW events,
// publish them with confirms, and write each outcome: PUBLISHED, back to NEW
// for a retry, or FAILED.
//
// One claim costs four database commands on MongoDB whatever the batch
// size (two finds, claim, mark; three on FerretDB) plus one per kind of
// failure, and the publishes of a batch
// are pipelined. Every write after the claim is fenced by the lease, so a
// worker that lost its claim to recovery changes nothing.
package claim
