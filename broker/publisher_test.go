package broker_test

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// waitTimeout bounds every wait for the broker in these tests.
const waitTimeout = 10 * time.Second

// startPublisher starts a Publisher on cfg and stops it in t.Cleanup. It
// fails the test unless the publisher is connected once Start returns.
func startPublisher(t *testing.T, cfg broker.Config) *broker.Publisher {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p, err := broker.New(cfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	testenv.Start(t, p)
	if err := p.Ready(); err != nil {
		t.Fatalf("Ready after Start: %v", err)
	}
	return p
}

// message builds a message the way the claimer does: from a stored
// document, through events.NewMessage.
func message(t *testing.T, doc bson.D) events.Message {
	t.Helper()
	raw := testenv.Marshal(t, doc)
	m, err := events.NewMessage(raw, 0)
	if err != nil {
		t.Fatalf("NewMessage: %v", err)
	}
	return m
}

// simpleMessage is a valid message with the given string _id and type.
func simpleMessage(t *testing.T, id, typ string) events.Message {
	t.Helper()
	return message(t, bson.D{
		{Key: "_id", Value: id},
		{Key: "type", Value: typ},
		{Key: "payload", Value: bson.D{{Key: "id", Value: id}}},
		{Key: "status", Value: "NEW"},
		{Key: "createdAt", Value: time.Now()},
	})
}

// receive reads n deliveries, keyed by message id, failing the test when
// they do not come in time or an id comes twice.
func receive(t *testing.T, deliveries <-chan amqp.Delivery, n int) map[string]amqp.Delivery {
	t.Helper()
	got := make(map[string]amqp.Delivery, n)
	timeout := time.After(waitTimeout)
	for len(got) < n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("deliveries closed after %d of %d messages", len(got), n)
			}
			if _, dup := got[d.MessageId]; dup {
				t.Fatalf("message %q delivered twice", d.MessageId)
			}
			got[d.MessageId] = d
		case <-timeout:
			t.Fatalf("received %d of %d messages within %s", len(got), n, waitTimeout)
		}
	}
	return got
}

// requireDeclaredTopicDurable checks, on a connection of its own, that the
// exchange exists as a durable topic exchange: a passive declare and an
// equivalent declare succeed, a declare as "direct" or as non-durable is
// refused with 406 PRECONDITION_FAILED. Each refusal closes its channel, so
// each check gets a channel of its own.
func requireDeclaredTopicDurable(t *testing.T, url, exchange string) {
	t.Helper()
	conn := testenv.Dial(t, url)
	declare := func(passive bool, kind string, durable bool) error {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("open channel: %v", err)
		}
		defer ch.Close() //nolint:errcheck // a refused declare has closed it already.
		if passive {
			return ch.ExchangeDeclarePassive(exchange, kind, durable, false, false, false, nil)
		}
		return ch.ExchangeDeclare(exchange, kind, durable, false, false, false, nil)
	}
	if err := declare(true, amqp.ExchangeTopic, true); err != nil {
		t.Fatalf("passive declare of %q (topic, durable): %v; the publisher did not declare it", exchange, err)
	}
	if err := declare(false, amqp.ExchangeTopic, true); err != nil {
		t.Errorf("declare %q as topic, durable (the same arguments): %v", exchange, err)
	}
	for _, tt := range []struct {
		kind    string
		durable bool
	}{
		{amqp.ExchangeDirect, true},
		{amqp.ExchangeTopic, false},
	} {
		err := declare(false, tt.kind, tt.durable)
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed {
			t.Errorf("declare %q as %s, durable=%t: err = %v, want 406 PRECONDITION_FAILED (the exchange must be a durable topic)",
				exchange, tt.kind, tt.durable, err)
		}
	}
}

// TestPublisherMessageContract checks every item of the message contract
// (docs/message-contract.md) on messages consumed from RabbitMQ.
func TestPublisherMessageContract(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")

	p := startPublisher(t, broker.Config{URL: url, Exchange: exchange})
	requireDeclaredTopicDurable(t, url, exchange)
	deliveries := testenv.Consume(t, url, exchange)

	oid := bson.NewObjectID()
	// Milliseconds on purpose: AMQP timestamps carry whole seconds.
	createdAt := time.Date(2024, 3, 4, 5, 6, 7, 890_000_000, time.UTC)
	headerTime := time.Date(2023, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	ref := bson.NewObjectID()
	amount, err := bson.ParseDecimal128("12.34")
	if err != nil {
		t.Fatal(err)
	}
	payload := bson.D{{Key: "n", Value: int32(1)}}

	withObjectID := message(t, bson.D{
		{Key: "_id", Value: oid},
		{Key: "type", Value: "order.created"},
		{Key: "aggregateType", Value: "order"},
		{Key: "aggregateId", Value: "o-42"},
		{Key: "payload", Value: payload},
		{Key: "headers", Value: bson.D{
			{Key: "tenant", Value: "acme"},
			{Key: "priority", Value: int32(7)},
			{Key: "sequence", Value: int64(1) << 40},
			{Key: "ratio", Value: 0.25},
			{Key: "replay", Value: true},
			{Key: "at", Value: headerTime},
			{Key: "ref", Value: ref},
			{Key: "amount", Value: amount},
			{Key: "raw", Value: bson.Binary{Data: []byte{0, 1, 2}}},
			{Key: "none", Value: nil},
			{Key: "nested", Value: bson.D{{Key: "k", Value: "v"}, {Key: "i", Value: int32(2)}}},
			{Key: "list", Value: bson.A{"a", int32(1), false}},
		}},
		{Key: "status", Value: "NEW"},
		{Key: "createdAt", Value: createdAt},
	})
	withStringID := message(t, bson.D{
		{Key: "_id", Value: "invoice-2024-0001"},
		{Key: "type", Value: "invoice.paid"},
		{Key: "aggregateId", Value: "inv-1"},
		{Key: "payload", Value: payload},
		// The aggregate field wins over an event header of the same name.
		{Key: "headers", Value: bson.D{{Key: events.HeaderAggregateID, Value: "spoofed"}}},
		{Key: "status", Value: "NEW"},
		{Key: "createdAt", Value: createdAt},
	})

	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	for i, err := range p.Publish(ctx, []events.Message{withObjectID, withStringID}) {
		if err != nil {
			t.Fatalf("Publish: message %d: %v", i, err)
		}
	}
	got := receive(t, deliveries, 2)

	if !regexp.MustCompile(`^[0-9a-f]{24}$`).MatchString(withObjectID.ID) || withObjectID.ID != oid.Hex() {
		t.Errorf("message id of an ObjectID event = %q, want its 24-hex form %q", withObjectID.ID, oid.Hex())
	}
	wantSecond := createdAt.Truncate(time.Second)
	tests := []struct {
		id, typ     string
		wantHeaders amqp.Table
	}{
		{
			id: oid.Hex(), typ: "order.created",
			wantHeaders: amqp.Table{
				"x-aggregate-type": "order",
				"x-aggregate-id":   "o-42",
				"tenant":           "acme",
				"priority":         int32(7),
				"sequence":         int64(1) << 40,
				"ratio":            0.25,
				"replay":           true,
				"at":               headerTime.Truncate(time.Second),
				"ref":              ref.Hex(),
				"amount":           "12.34",
				"raw":              []byte{0, 1, 2},
				"none":             nil,
				"nested":           amqp.Table{"k": "v", "i": int32(2)},
				"list":             []any{"a", int32(1), false},
			},
		},
		{
			id: "invoice-2024-0001", typ: "invoice.paid",
			wantHeaders: amqp.Table{"x-aggregate-id": "inv-1"},
		},
	}
	for _, tt := range tests {
		d, ok := got[tt.id]
		if !ok {
			t.Errorf("no delivery with message_id %q; got ids %v", tt.id, keys(got))
			continue
		}
		if d.Exchange != exchange {
			t.Errorf("%s: exchange = %q, want %q", tt.id, d.Exchange, exchange)
		}
		if d.RoutingKey != tt.typ {
			t.Errorf("%s: routing key = %q, want the event type %q", tt.id, d.RoutingKey, tt.typ)
		}
		if d.DeliveryMode != amqp.Persistent {
			t.Errorf("%s: delivery mode = %d, want %d (persistent)", tt.id, d.DeliveryMode, amqp.Persistent)
		}
		if d.Type != tt.typ {
			t.Errorf("%s: type property = %q, want %q", tt.id, d.Type, tt.typ)
		}
		if !d.Timestamp.Equal(wantSecond) {
			t.Errorf("%s: timestamp = %s, want createdAt to the second %s", tt.id, d.Timestamp.UTC(), wantSecond)
		}
		if d.ContentType != "application/json" {
			t.Errorf("%s: content type = %q, want application/json", tt.id, d.ContentType)
		}
		if diff := cmp.Diff(tt.wantHeaders, d.Headers); diff != "" {
			t.Errorf("%s: headers (-want +got):\n%s", tt.id, diff)
		}
		if string(d.Body) != `{"n":1}` {
			t.Errorf("%s: body = %s, want {\"n\":1}", tt.id, d.Body)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestPublishReturnedIsNotConfirmed publishes, in one call, messages that a
// queue is bound for and one that no queue is bound for: only the latter
// fails, as ErrReturned, and only the former arrive.
func TestPublishReturnedIsNotConfirmed(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")

	deliveries := testenv.Consume(t, url, exchange, "order.created")

	p := startPublisher(t, broker.Config{URL: url, Exchange: exchange})
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	errs := p.Publish(ctx, []events.Message{
		simpleMessage(t, "routed-1", "order.created"),
		simpleMessage(t, "unroutable", "nobody.listens"),
		simpleMessage(t, "routed-2", "order.created"),
	})
	if len(errs) != 3 {
		t.Fatalf("Publish returned %d errors for 3 messages", len(errs))
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("routable messages: errors %v and %v, want nil (confirmed)", errs[0], errs[2])
	}
	if !errors.Is(errs[1], events.ErrReturned) {
		t.Errorf("unroutable message: error %v, want ErrReturned", errs[1])
	}
	got := receive(t, deliveries, 2)
	if _, ok := got["routed-1"]; !ok {
		t.Errorf("routed-1 not delivered; got %v", keys(got))
	}
	if _, ok := got["routed-2"]; !ok {
		t.Errorf("routed-2 not delivered; got %v", keys(got))
	}

	// The next publish starts clean: no return of the last call is blamed
	// on a message of this one.
	for i, err := range p.Publish(ctx, []events.Message{simpleMessage(t, "routed-3", "order.created")}) {
		if err != nil {
			t.Errorf("publish after a return: message %d: %v", i, err)
		}
	}
	receive(t, deliveries, 1)
}

// TestPublisherLifecycle checks Ready, Publish and Stop before Start and
// after Stop.
func TestPublisherLifecycle(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	msgs := []events.Message{
		simpleMessage(t, "a", "order.created"),
		simpleMessage(t, "b", "order.created"),
	}
	requireAllUnavailable := func(when string, errs []error) {
		t.Helper()
		if len(errs) != len(msgs) {
			t.Fatalf("%s: Publish returned %d errors for %d messages", when, len(errs), len(msgs))
		}
		for i, err := range errs {
			if !errors.Is(err, events.ErrUnavailable) {
				t.Errorf("%s: message %d: error %v, want ErrUnavailable", when, i, err)
			}
		}
	}

	t.Run("before Start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		p, err := broker.New(broker.Config{URL: url, Exchange: exchange, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Ready(); !errors.Is(err, events.ErrUnavailable) {
			t.Errorf("Ready before Start = %v, want ErrUnavailable (not connected)", err)
		}
		requireAllUnavailable("before Start", p.Publish(ctx, msgs))
		for i := range 2 {
			if err := p.Stop(ctx); err != nil {
				t.Errorf("Stop #%d before Start: %v", i+1, err)
			}
		}
	})

	t.Run("after Stop", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		exchange := testenv.UniqueName(t, "ex_")
		deliveries := testenv.Consume(t, url, exchange)
		p := startPublisher(t, broker.Config{URL: url, Exchange: exchange})
		for i, err := range p.Publish(ctx, msgs) {
			if err != nil {
				t.Fatalf("Publish while started: message %d: %v", i, err)
			}
		}
		receive(t, deliveries, len(msgs))
		for i := range 2 {
			if err := p.Stop(ctx); err != nil {
				t.Errorf("Stop #%d: %v", i+1, err)
			}
		}
		if err := p.Ready(); !errors.Is(err, events.ErrUnavailable) {
			t.Errorf("Ready after Stop = %v, want ErrUnavailable", err)
		}
		requireAllUnavailable("after Stop", p.Publish(ctx, msgs))
	})
}

// TestConfigRejectsBadURL checks that New and Validate refuse a URL that is
// not amqp:// or amqps://, without repeating its password.
func TestConfigRejectsBadURL(t *testing.T) {
	t.Parallel()
	const password = "s3cretPW"
	tests := []struct{ name, url string }{
		{"empty", ""},
		{"http", "http://guest:" + password + "@127.0.0.1:5672/"},
		{"mongodb", "mongodb://guest:" + password + "@127.0.0.1:27017/"},
		{"no host", "amqp://guest:" + password + "@/"},
		{"no scheme", "guest:" + password + "@127.0.0.1:5672"},
		{"scheme without slashes", "amqp:guest:" + password + "@127.0.0.1:5672"},
		{"missing colon", "amqp//guest:" + password + "@127.0.0.1:5672/"},
		{"unparsable", "amqp://guest:" + password + "%zz@127.0.0.1:5672/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := broker.Config{URL: tt.url}
			validateErr := cfg.Validate()
			_, newErr := broker.New(cfg)
			for what, err := range map[string]error{"Validate": validateErr, "New": newErr} {
				if err == nil {
					t.Errorf("%s(%q): no error, want one", what, tt.url)
					continue
				}
				if strings.Contains(err.Error(), password) {
					t.Errorf("%s error leaks the password: %v", what, err)
				}
				if !strings.Contains(err.Error(), "URL") {
					t.Errorf("%s error does not name the URL setting: %v", what, err)
				}
			}
		})
	}
}

// TestNewRejectsBadSettings checks that a bad value is refused by New, not
// replaced by its default, and that the error names the setting and value.
func TestNewRejectsBadSettings(t *testing.T) {
	t.Parallel()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	testenv.WantRefused(t, func(c broker.Config) error { _, err := broker.New(c); return err }, map[string]broker.Config{
		"broker: Window -1":        {URL: url, Window: -1},
		"broker: ReconnectMin -1s": {URL: url, ReconnectMin: -time.Second},
		"broker: ReconnectMax 30s: want at least ReconnectMin (1m0s)": {URL: url, ReconnectMin: time.Minute},
		"broker: WriteTimeout -1s":                                    {URL: url, WriteTimeout: -time.Second},
	})
	if _, err := broker.New(broker.Config{URL: url}); err != nil {
		t.Errorf("New with every default: %v", err)
	}
}
