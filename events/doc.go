// Package events is the outbox event model: the document producers write, the
// statuses an event moves through and the transitions allowed between them,
// the message an event becomes on the broker, and a small API for Go
// producers to write a NEW event inside their own MongoDB transaction.
//
// It is in the module github.com/outboxrelay/outbox/events, with
// events/inbox: the API services import, under semantic versioning
// (docs/api.md). The module imports nothing of the relay's, and its go.mod
// names only what these packages need, so that producer services can
// depend on it without pulling in the worker.
//
// The lifecycle:
//
//	NEW ──claim──▶ PROCESSING ──confirm──▶ PUBLISHED
//	 ▲                 │  │
//	 └──release/stale──┘  └──poison/max attempts──▶ FAILED ──requeue──▶ NEW
package events
