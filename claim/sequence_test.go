package claim

// The aggregate's own version against the real store and broker: two
// producers whose clocks are 2 s apart write one aggregate's events with
// a sequence, and the consumer gets them in sequence order whatever their
// createdAt says.

import (
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
)

// skewedProducer writes events as a producer whose wall clock is off by
// skew: createdAt is the real time of the write plus skew.
type skewedProducer struct {
	skew time.Duration
}

// write inserts one event of aggregate agg with sequence seq, written at
// the real instant at (by this producer's clock, at+skew).
func (p skewedProducer) write(t *testing.T, coll *driver.Collection, agg string, seq int64, at time.Time) string {
	t.Helper()
	id := fmt.Sprintf("%s-v%d", agg, seq)
	doc, err := events.Draft{ID: id, Type: "order.changed", AggregateType: "order", AggregateID: agg,
		Sequence: &seq, Payload: bson.D{{Key: "version", Value: seq}}}.Document(at.Add(p.skew))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(t.Context(), doc); err != nil {
		t.Fatal(err)
	}
	return id
}

// writeSkewed has producers a (clock 2 s behind) and b (on time) take
// turns writing versions 1 to n of aggregate agg, b first, 400 ms apart
// in real time: every version a writes sorts by createdAt before the
// version b wrote just before it. It returns the ids in version order.
func writeSkewed(t *testing.T, coll *driver.Collection, agg string, n int64) []string {
	t.Helper()
	a, b := skewedProducer{skew: -2 * time.Second}, skewedProducer{}
	start := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	var ids []string
	for v := int64(1); v <= n; v++ {
		p := b
		if v%2 == 0 {
			p = a
		}
		ids = append(ids, p.write(t, coll, agg, v, start.Add(time.Duration(v)*400*time.Millisecond)))
	}
	return ids
}

// receive returns the next n deliveries, failing after a deadline.
func receive(t *testing.T, deliveries <-chan amqp.Delivery, n int) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	deadline := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case d := <-deliveries:
			out = append(out, d)
		case <-deadline:
			t.Fatalf("received %d of %d messages", len(out), n)
		}
	}
	return out
}

// TestSequenceOrdersSkewedProducers: producers with clocks 2 s apart
// write versions 1 to 6 of one aggregate, so that createdAt puts every
// even version before the odd one written just before it. The consumer
// receives them in version order, each once, each carrying its version
// in x-aggregate-sequence: in one batch, and one event a claim, where
// version 1 (the latest createdAt of the first two) is outside the
// claim's read when version 2 is claimed.
func TestSequenceOrdersSkewedProducers(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{10, 1} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			t.Parallel()
			r := setup(t)
			want := writeSkewed(t, r.coll, "o-1", 6)
			c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{BatchSize: batch})
			for i := 0; runOnce(t, c) || i < len(want); i++ {
				if i > 40 {
					t.Fatal("the claimer kept reporting more after 40 runs")
				}
			}
			var got []string
			for _, d := range receive(t, r.deliveries, len(want)) {
				got = append(got, d.MessageId)
				v := d.Headers[events.HeaderSequence]
				if want := fmt.Sprintf("o-1-v%d", v); want != d.MessageId {
					t.Errorf("message %s carries %s %v", d.MessageId, events.HeaderSequence, v)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("consumer received %v; want the version order %v", got, want)
			}
		})
	}
}
