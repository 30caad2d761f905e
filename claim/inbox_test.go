package claim

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// inbox records what a queue delivers: the message ids in arrival order,
// and how many times each came.
type inbox struct {
	mu    sync.Mutex
	order []string
	count map[string]int
}

// startInbox reads deliveries until the test ends.
func startInbox(t *testing.T, deliveries <-chan amqp.Delivery) *inbox {
	in := &inbox{count: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case d, ok := <-deliveries:
				if !ok {
					return
				}
				in.mu.Lock()
				in.order = append(in.order, d.MessageId)
				in.count[d.MessageId]++
				in.mu.Unlock()
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return in
}

// distinct returns how many different messages have come.
func (in *inbox) distinct() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.count)
}

// deliveries returns how many messages have come, duplicates included.
func (in *inbox) deliveries() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.order)
}

// snapshot returns how many times each message has come so far.
func (in *inbox) snapshot() map[string]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return maps.Clone(in.count)
}

// waitDistinct waits until n distinct messages have come.
func (in *inbox) waitDistinct(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, waitFor, func() (bool, string) {
		got := in.distinct()
		return got >= n, fmt.Sprintf("%d of %d distinct messages received", got, n)
	})
}
