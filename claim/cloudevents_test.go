package claim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	sdkamqp "github.com/cloudevents/sdk-go/protocol/amqp/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestCloudEventsConsumer: a consumer reads the messages of both
// CloudEvents formats with the CloudEvents SDK for Go's own AMQP binding
// (github.com/cloudevents/sdk-go/protocol/amqp/v2, on go-amqp), through
// RabbitMQ's AMQP 1.0 plugin, after the claimer has published them over
// AMQP 0-9-1 from FerretDB: binary mode with the prefix that binding
// reads, cloudEvents:, and structured mode through the SDK's JSON event
// format. An event that cannot be a CloudEvent, or whose envelope is too
// big, is FAILED with the reason.
func TestCloudEventsConsumer(t *testing.T) {
	t.Parallel()
	const (
		source      = "/outbox/shop/events"
		traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		traceState  = "rojo=00f067aa0ba902b7"
	)
	// Milliseconds without a trailing zero for every event (.111 on): a
	// CloudEvents time drops trailing zeros, so the poison envelope's size
	// below would otherwise change with the clock.
	createdAt := time.Now().Add(-time.Hour).Truncate(time.Second).Add(111 * time.Millisecond).UTC()
	payload := bson.D{{Key: "orderId", Value: "o-1"}, {Key: "totalCents", Value: int64(4200)}, {Key: "at", Value: createdAt}}
	wantData := map[string]any{"orderId": "o-1", "totalCents": 4200.0, "at": map[string]any{"$date": createdAt.Format("2006-01-02T15:04:05.999Z07:00")}}
	drafts := []events.Draft{
		{ID: bson.NewObjectID(), Type: "order.created", AggregateType: "order", AggregateID: "o-1", Payload: payload,
			Headers: map[string]any{"tenant": "acme", "cloudEvents:id": "forged", "cloudEvents:subject": "forged", "cloudEvents:region": "eu"},
			Trace:   events.TraceContext{Parent: traceParent, State: traceState}},
		// Non-ASCII type and id, no aggregate, no trace.
		{ID: "bestellung-2-ändert", Type: "bestellung.geändert", Payload: payload},
	}
	// wantEvent is what the consumer must read of drafts[i].
	wantEvent := func(i int, format string) cloudevents.Event {
		d := drafts[i]
		e := cloudevents.NewEvent()
		switch id := d.ID.(type) {
		case bson.ObjectID:
			e.SetID(id.Hex())
		case string:
			e.SetID(id)
		}
		e.SetSource(source)
		e.SetType(d.Type)
		e.SetTime(createdAt.Add(time.Duration(i) * time.Millisecond))
		e.SetSubject(d.AggregateID)
		if d.Trace.Parent != "" {
			e.SetExtension("traceparent", d.Trace.Parent)
			e.SetExtension("tracestate", d.Trace.State)
		}
		if r, ok := d.Headers["cloudEvents:region"]; ok && format == events.FormatCloudEventsBinary {
			e.SetExtension("region", r)
		}
		return e
	}

	for _, tt := range []struct {
		format, contentType string
		poison              events.Draft // FAILED at once, with wantError
		wantError           string
	}{
		{
			format: events.FormatCloudEventsBinary, contentType: "application/json",
			poison:    events.Draft{Type: "order.created", AggregateID: "o-\x01", Payload: payload},
			wantError: `invalid event: field "aggregateId" holds the control character U+0001 at byte 2, which the CloudEvents attribute subject must not hold`,
		},
		{
			format: events.FormatCloudEventsStructured, contentType: "application/cloudevents+json",
			poison:    events.Draft{Type: "order.created", Payload: bson.D{{Key: "blob", Value: strings.Repeat("x", 900)}}},
			wantError: `invalid event: field "payload" is 911 bytes as JSON, in a CloudEvents envelope of 1097 bytes; the broker takes at most 1000`,
		},
	} {
		t.Run(tt.format, func(t *testing.T) {
			t.Parallel()
			r := setup(t)
			receiver := consumeAMQP10(t, r.exchange)
			c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{
				Format: events.Format{Name: tt.format, Source: source, Prefix: events.PrefixAMQPColon}, MaxBodyBytes: 1000})
			all := append(append([]events.Draft{}, drafts...), tt.poison)
			all[2].ID = bson.NewObjectID()
			for i, d := range all {
				doc, err := d.Document(createdAt.Add(time.Duration(i) * time.Millisecond))
				if err != nil {
					t.Fatalf("draft %d: %v", i, err)
				}
				if _, err := r.coll.InsertOne(t.Context(), doc); err != nil {
					t.Fatalf("insert %d: %v", i, err)
				}
			}
			runOnce(t, c)

			index := map[string]int{}
			for i := range drafts {
				index[wantEvent(i, tt.format).ID()] = i
			}
			seen := map[string]bool{}
			for _, msg := range receiveAMQP10(t, receiver, len(drafts)) {
				m := sdkamqp.NewMessage(msg, receiver)
				e, err := binding.ToEvent(t.Context(), m)
				if err != nil {
					t.Fatalf("sdk-go's AMQP binding cannot read the message (application-properties %v): %v", msg.ApplicationProperties, err)
				}
				i, ok := index[e.ID()]
				if !ok {
					t.Fatalf("an event %s the test did not write", e.ID())
				}
				seen[e.ID()] = true
				if ct := msg.Properties.ContentType; ct == nil || *ct != tt.contentType {
					t.Errorf("event %s: content type %v, want %q", e.ID(), ct, tt.contentType)
				}
				checkCloudEvent(t, e, wantEvent(i, tt.format), wantData)
				if err := m.Finish(nil); err != nil {
					t.Errorf("accept: %v", err)
				}
			}
			if len(seen) != len(drafts) {
				t.Errorf("read events %v, want %d distinct", seen, len(drafts))
			}

			stored := allEvents(t, r.coll)
			poisonID := all[2].ID.(bson.ObjectID).Hex()
			if e := stored[poisonID]; e.Status != events.StatusFailed || e.LastError != tt.wantError {
				t.Errorf("poison event: status %s, lastError %q; want FAILED with %q", e.Status, e.LastError, tt.wantError)
			}
			for id, e := range stored {
				if id != poisonID && e.Status != events.StatusPublished {
					t.Errorf("event %s: status %s, want PUBLISHED", id, e.Status)
				}
			}
		})
	}
}

// TestCloudEventsUnderscorePrefix: with the default prefix, cloudEvents_,
// an AMQP 1.0 consumer finds the attributes among the application
// properties as the AMQP binding's working draft names them, which the
// Java SDK's Spring AMQP support reads over AMQP 0-9-1 too; sdk-go's AMQP
// binding, which follows 1.0.2, does not take the message for a binary
// CloudEvent (docs/message-contract.md says which prefix each reads).
func TestCloudEventsUnderscorePrefix(t *testing.T) {
	t.Parallel()
	r := setup(t)
	receiver := consumeAMQP10(t, r.exchange)
	c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{
		Format: events.Format{Name: events.FormatCloudEventsBinary, Source: "/outbox/shop/events"}})
	d, err := events.Draft{ID: "e-1", Type: "order.created", AggregateID: "o-1", Payload: bson.D{{Key: "n", Value: 1}},
		Headers: map[string]any{"cloudEvents_region": "eu"}}.Document(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.coll.InsertOne(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	runOnce(t, c)
	msg := receiveAMQP10(t, receiver, 1)[0]
	if err := receiver.AcceptMessage(t.Context(), msg); err != nil {
		t.Errorf("accept: %v", err)
	}
	got := map[string]any{}
	for k, v := range msg.ApplicationProperties {
		if k != "cloudEvents_time" {
			got[k] = v
		}
	}
	want := map[string]any{"cloudEvents_specversion": "1.0", "cloudEvents_id": "e-1", "cloudEvents_source": "/outbox/shop/events",
		"cloudEvents_type": "order.created", "cloudEvents_subject": "o-1", "cloudEvents_region": "eu"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("application-properties (-want +got):\n%s", diff)
	}
	if enc := sdkamqp.NewMessage(msg, receiver).ReadEncoding(); enc != binding.EncodingUnknown {
		t.Errorf("sdk-go's AMQP binding reads the message as %v; the test's premise (it reads only cloudEvents:) no longer holds", enc)
	}
}

// checkCloudEvent checks e, as the SDK read it, against want and the data
// against wantData.
func checkCloudEvent(t *testing.T, e *cloudevents.Event, want cloudevents.Event, wantData map[string]any) {
	t.Helper()
	if err := e.Validate(); err != nil {
		t.Errorf("event %s: not a valid CloudEvent: %v", want.ID(), err)
	}
	got := map[string]any{
		"specversion": e.SpecVersion(), "id": e.ID(), "source": e.Source(), "type": e.Type(),
		"time": e.Time().UTC(), "subject": e.Subject(), "datacontenttype": e.DataContentType(),
		"extensions": e.Extensions(),
	}
	wantAttrs := map[string]any{
		"specversion": "1.0", "id": want.ID(), "source": want.Source(), "type": want.Type(),
		"time": want.Time().UTC(), "subject": want.Subject(), "datacontenttype": "application/json",
		"extensions": want.Extensions(),
	}
	if diff := cmp.Diff(wantAttrs, got); diff != "" {
		t.Errorf("event %s: attributes (-want +got):\n%s", want.ID(), diff)
	}
	var data map[string]any
	if err := e.DataAs(&data); err != nil {
		t.Errorf("event %s: data: %v", want.ID(), err)
	}
	if diff := cmp.Diff(wantData, data); diff != "" {
		t.Errorf("event %s: data (-want +got):\n%s", want.ID(), diff)
	}
}

// With tracing on and TraceMessagePublish, a CloudEvents message's
// traceparent header names the relay's publish span, while its tracing
// extension keeps naming the producer's span, the start of the event's
// trace: the binary header, and the structured envelope as sdk-go's event
// decoding reads it.
func TestPublishSpanKeepsTheCloudEventsExtension(t *testing.T) {
	t.Parallel()
	pub := &capturePublisher{}
	c, rec := tracedClaimer(t, pub, sdktrace.AlwaysSample(), "", TraceMessagePublish)
	d, err := events.Draft{ID: "ce-traced", Type: "order.created", Payload: bson.D{{Key: "n", Value: 1}},
		Trace: events.TraceContext{Parent: producerTraceParent}}.Document(time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	doc := testenv.Marshal(t, d)
	var msgs []events.Message
	for _, name := range []string{events.FormatCloudEventsBinary, events.FormatCloudEventsStructured} {
		m, err := events.Format{Name: name, Source: "/outbox/shop/events"}.NewMessage(doc, 0)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	for i, m := range msgs {
		if errs := c.publishMessages(t.Context(), []events.Message{m}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		ended := rec.Ended()
		if len(ended) != i+1 || len(pub.got) != i+1 {
			t.Fatalf("after publish %d: %d spans ended, %d messages published", i+1, len(ended), len(pub.got))
		}
		span, sent := ended[i], pub.got[i]
		relayParent := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
		if got := sent.Headers[events.FieldTraceParent]; got != relayParent {
			t.Errorf("%s: traceparent header %v, want the publish span's %s", sent.ContentType, got, relayParent)
		}
		extension := sent.Headers[events.PrefixAMQP+"traceparent"]
		if sent.ContentType == events.ContentTypeCloudEvents {
			var e cloudevents.Event
			if err := json.Unmarshal(sent.Body, &e); err != nil {
				t.Fatalf("sdk-go cannot read the envelope: %v", err)
			}
			extension = e.Extensions()["traceparent"]
		}
		if extension != producerTraceParent {
			t.Errorf("%s: tracing extension %v, want the producer's %s", sent.ContentType, extension, producerTraceParent)
		}
	}
}
