package main

import (
	"context"
	"io"

	"github.com/outboxrelay/outbox/mongo"
)

// discardCommand is `worker discard`: it marks FAILED events discarded,
// a skip that no requeue undoes, for an event an operator decided is
// never to be published. The events are kept, with who, when and why;
// the action is recorded in the audit and logged.
func discardCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return markCommand(ctx, args, getenv, stdout, stderr, failedMark{
		verb: "discard", done: "discarded", by: "discardedBy", reason: "discardReason",
		mark:   (*mongo.Store).Discard,
		logMsg: "FAILED events discarded; they are kept, never requeued, and later events of their aggregates flow",
	})
}
