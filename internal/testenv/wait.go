package testenv

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/backoff"
)

// WaitTimeout bounds every wait of a test on a server or a loop.
const WaitTimeout = 30 * time.Second

// Eventually asks again after pollMin at first, then less often up to
// pollMax: a quick answer for what settles at once, and a database that a
// slow condition does not keep busy.
const (
	pollMin = 10 * time.Millisecond
	pollMax = 100 * time.Millisecond
)

// Eventually asks cond until it reports done, and fails the test with
// cond's last word on why not once timeout has passed. Tests wait for a
// loop or a server with it instead of sleeping.
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, why string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := backoff.Backoff{Min: pollMin, Max: pollMax}
	for {
		done, why := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done after %s: %s", timeout, why)
		}
		time.Sleep(wait.Next())
	}
}

// WaitReady waits until ready reports nil, as /readyz would, and fails the
// test with its last error after WaitTimeout.
func WaitReady(t testing.TB, ready func() error) {
	t.Helper()
	Eventually(t, WaitTimeout, func() (bool, string) {
		err := ready()
		return err == nil, fmt.Sprint("not ready: ", err)
	})
}

// Receive reads deliveries until every id in want has arrived at least
// once, and returns how many times each id (wanted or not) arrived. It
// fails the test after timeout with the number still missing.
func Receive(t testing.TB, deliveries <-chan amqp.Delivery, want []string, timeout time.Duration) map[string]int {
	t.Helper()
	missing := make(map[string]bool, len(want))
	for _, id := range want {
		missing[id] = true
	}
	got := map[string]int{}
	deadline := time.After(timeout)
	for len(missing) > 0 {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("deliveries closed with %d of %d messages missing", len(missing), len(want))
			}
			got[d.MessageId]++
			delete(missing, d.MessageId)
		case <-deadline:
			t.Fatalf("%d of %d messages not received after %s", len(missing), len(want), timeout)
		}
	}
	return got
}
