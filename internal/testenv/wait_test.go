package testenv

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestEventuallyReturnsOnceDone(t *testing.T) {
	t.Parallel()
	calls := 0
	Eventually(t, time.Second, func() (bool, string) {
		calls++
		return calls == 3, fmt.Sprint("calls ", calls)
	})
	if calls != 3 {
		t.Errorf("cond asked %d times, want 3", calls)
	}
}

func TestEventuallyFailsAfterTimeout(t *testing.T) {
	t.Parallel()
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(rec, 30*time.Millisecond, func() (bool, string) { return false, "never" })
	}()
	<-done
	if !rec.failed {
		t.Fatal("Eventually did not fail the test after its timeout")
	}
	if rec.msg == "" {
		t.Error("the failure says nothing")
	}
}

func TestReceiveCountsEveryArrival(t *testing.T) {
	t.Parallel()
	ch := make(chan amqp.Delivery, 4)
	for _, id := range []string{"a", "b", "a", "c"} {
		ch <- amqp.Delivery{MessageId: id}
	}
	got := Receive(t, ch, []string{"a", "b", "c"}, time.Second)
	if got["a"] != 2 || got["b"] != 1 || got["c"] != 1 {
		t.Errorf("Receive = %v, want a:2 b:1 c:1", got)
	}
}

// recorder stands in for a test that Fatalf must fail: it records the
// failure and ends the goroutine, as testing.T does.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
