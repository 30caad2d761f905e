package tally

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
)

func TestTally(t *testing.T) {
	t.Parallel()
	tl := New()
	t0 := time.Unix(100, 0)
	for i, id := range []string{"a", "b", "a", "c"} {
		tl.Add(id, t0.Add(time.Duration(i)*time.Second))
	}
	if d, n, last := tl.Snapshot(); d != 3 || n != 4 || !last.Equal(t0.Add(3*time.Second)) {
		t.Errorf("Snapshot() = %d, %d, %v; want 3 distinct of 4, the last at +3s", d, n, last)
	}
	if diff := cmp.Diff(map[string]int{"a": 2, "b": 1, "c": 1}, tl.Counts()); diff != "" {
		t.Errorf("Counts() (-want +got):\n%s", diff)
	}
	order, last := tl.Order()
	if diff := cmp.Diff([]string{"a", "b", "c"}, order); diff != "" || !last.Equal(t0.Add(3*time.Second)) {
		t.Errorf("Order() = %v, %v; want a b c, the last new at +3s (-want +got):\n%s", order, last, diff)
	}
	if diff := cmp.Diff(map[string]int{"a": 0, "b": 1, "c": 3}, tl.FirstPositions()); diff != "" {
		t.Errorf("FirstPositions() (-want +got):\n%s", diff)
	}
	if got := tl.FirstArrivals()["a"]; !got.Equal(t0) {
		t.Errorf("first arrival of a = %v, want %v", got, t0)
	}
}

func TestWaitDistinct(t *testing.T) {
	t.Parallel()
	tl := New()
	deliveries := make(chan amqp.Delivery)
	done := tl.Consume(deliveries)
	go func() {
		for _, id := range []string{"a", "a", "b"} {
			deliveries <- amqp.Delivery{MessageId: id}
		}
		close(deliveries)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := tl.WaitDistinct(ctx, 2); err != nil {
		t.Fatalf("WaitDistinct(2): %v", err)
	}
	<-done
	short, cancelShort := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancelShort()
	if err := tl.WaitDistinct(short, 3); err == nil {
		t.Error("WaitDistinct(3) returned nil with 2 ids arrived")
	}
}
