package broker_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

func TestPublisherSkipsANodeThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, amqpURL, exchange)
	dead := testenv.ClosedPortURL(t, amqpURL)

	p := startPublisher(t, broker.Config{
		URL: dead + "," + amqpURL, Exchange: exchange,
		ReconnectMin: reconnectMin, ReconnectMax: reconnectMax,
	})
	if got, want := p.Node(), redact.URL(amqpURL); got != want {
		t.Errorf("Node = %q, want the second node %q", got, want)
	}
	msgs := make([]events.Message, 20)
	for i := range msgs {
		msgs[i] = simpleMessage(t, fmt.Sprintf("m-%d", i), "order.created")
	}
	for i, err := range p.Publish(t.Context(), msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	testenv.Receive(t, deliveries, ids, waitTimeout)
}

// cutOnPublish cuts the first node's link during the n-th publish.
type cutOnPublish struct {
	*broker.Publisher
	calls atomic.Int32
	n     int32
	cut   func()
}

func (c *cutOnPublish) Publish(ctx context.Context, msgs []events.Message) []error {
	if c.calls.Add(1) == c.n {
		c.cut()
	}
	return c.Publisher.Publish(ctx, msgs)
}

// A relay whose first node goes away in the middle of a backlog moves to
// the second node and delivers every event.
func TestRelayFailsOverToTheNextNode(t *testing.T) {
	t.Parallel()
	const total, batch = 600, 100
	ctx := t.Context()
	store := mongotest.Store(t)
	coll := store.Collection()
	base := time.Now().UTC().Add(-time.Minute)
	docs := make([]any, total)
	want := map[string]bool{}
	for i := range docs {
		id := bson.NewObjectID()
		want[id.Hex()] = true
		docs[i] = mongotest.Event(id, events.StatusNew, base.Add(time.Duration(i)*time.Millisecond))
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}

	amqpURL := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, amqpURL, exchange)
	first, proxy := testenv.Proxied(t, amqpURL)
	var logs testenv.LogBuffer
	pub := startPublisher(t, broker.Config{
		URL: first + "," + amqpURL, Exchange: exchange,
		ReconnectMin: reconnectMin, ReconnectMax: reconnectMax,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if got, want := pub.Node(), redact.URL(first); got != want {
		t.Fatalf("Node = %q, want the first node %q", got, want)
	}
	// The first node stays away: a lost connection must not come back to
	// it while the second answers.
	relay := &cutOnPublish{Publisher: pub, n: 3, cut: proxy.Cut}
	c, err := claim.New(store, relay, claim.Config{
		WorkerID: "failover", Schedule: "@every 100ms", BatchSize: batch,
		PublishTimeout: 5 * time.Second, StaleAfter: 20 * time.Second,
		Archetype: service.Archetype{Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, c)

	ids := make([]string, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	seen := testenv.Receive(t, deliveries, ids, 2*time.Minute)
	for id := range seen {
		if !want[id] {
			t.Errorf("unexpected message id %q", id)
		}
	}
	if relay.calls.Load() < relay.n {
		t.Fatalf("the link was never cut: %d publishes", relay.calls.Load())
	}
	if got, want := pub.Node(), redact.URL(amqpURL); got != want {
		t.Errorf("Node after the cut = %q, want the second node %q", got, want)
	}
	if !strings.Contains(logs.String(), "broker connection lost") {
		t.Errorf("no lost connection logged:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Errorf("a password reached the log:\n%s", logs.String())
	}
	t.Logf("FAILOVER-FIGURES: %d events, %d publishes, %d redelivered after the cut", total, relay.calls.Load(), redelivered(seen))
}

func redelivered(seen map[string]int) int {
	n := 0
	for _, c := range seen {
		n += c - 1
	}
	return n
}
