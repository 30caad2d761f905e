// Package wake triggers a claim as soon as a NEW event is inserted, by
// watching the outbox with a change stream, so that a quiet outbox's
// latency is a database round trip rather than the claim schedule's period.
// The schedule stays the fallback: it runs whatever the watcher does, and
// covers what a change stream does not see (events put back to NEW by a
// release, recovery or requeue).
//
// Where change streams are not supported (a standalone server, FerretDB)
// the watcher finds out by trying to open one, logs it once and ends,
// leaving the schedule alone to poll. Other errors (a lost connection, a
// primary stepping down) close the stream; the watcher reopens it after a
// backoff, resuming after the last event it saw.
package wake
