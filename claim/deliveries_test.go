package claim

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/tally"
)

// inbox is the tally of what a queue delivers, with the waits and checks
// of these tests.
type inbox struct{ *tally.Tally }

// startInbox tallies deliveries until the test ends. The queue's consumer
// is closed by a cleanup that runs after this test's own, so the tally
// stops on the test's context rather than on deliveries closing.
func startInbox(t *testing.T, deliveries <-chan amqp.Delivery) *inbox {
	in := &inbox{tally.New()}
	ctx := t.Context() // cancelled before the cleanups run
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case d, ok := <-deliveries:
				if !ok {
					return
				}
				in.Add(d.MessageId, time.Now())
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { <-done })
	return in
}

// distinct returns how many different messages have come.
func (in *inbox) distinct() int {
	d, _, _ := in.Snapshot()
	return d
}

// deliveries returns how many messages have come, duplicates included.
func (in *inbox) deliveries() int {
	_, total, _ := in.Snapshot()
	return total
}

// waitDistinct waits until n distinct messages have come.
func (in *inbox) waitDistinct(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	if err := in.WaitDistinct(ctx, n); err != nil {
		d, total, _ := in.Snapshot()
		t.Fatalf("%d of %d distinct messages received (%d deliveries) within %s: %v", d, n, total, waitFor, err)
	}
}
