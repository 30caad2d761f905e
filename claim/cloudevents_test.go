package claim

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// ceSpecs reads the attributes of a binary-mode message: ce-<name>.
var ceSpecs = spec.WithPrefix(events.PrefixKnative)

// deliveryMessage lets the CloudEvents SDK read a delivery: its binding
// for AMQP is for AMQP 1.0, so this is the one for RabbitMQ's 0-9-1 as
// the relay writes it: in structured mode the content type names the
// format, in binary mode the ce- headers are the attributes and the
// content type is datacontenttype.
type deliveryMessage struct{ d amqp.Delivery }

var (
	_ binding.Message               = deliveryMessage{}
	_ binding.MessageMetadataReader = deliveryMessage{}
)

func (m deliveryMessage) ReadEncoding() binding.Encoding {
	if format.Lookup(m.d.ContentType) != nil {
		return binding.EncodingStructured
	}
	if _, ok := m.d.Headers[ceSpecs.PrefixedSpecVersionName()]; ok {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m deliveryMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	f := format.Lookup(m.d.ContentType)
	if f == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(m.d.Body))
}

// version is the spec version of a binary-mode message; nil if none.
func (m deliveryMessage) version() spec.Version {
	sv, _ := m.d.Headers[ceSpecs.PrefixedSpecVersionName()].(string)
	return ceSpecs.Version(sv)
}

func (m deliveryMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	v := m.version()
	if v == nil {
		return nil, nil
	}
	attr := v.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		return attr, m.d.ContentType
	}
	return attr, m.d.Headers[attr.PrefixedName()]
}

func (m deliveryMessage) GetExtension(name string) any {
	return m.d.Headers[ceSpecs.Prefix()+name]
}

func (m deliveryMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	v := m.version()
	if v == nil {
		return binding.ErrNotBinary
	}
	for name, value := range m.d.Headers {
		ext, ok := strings.CutPrefix(name, v.Prefix())
		if !ok {
			continue
		}
		var err error
		if attr := v.Attribute(name); attr != nil {
			err = w.SetAttribute(attr, value)
		} else {
			err = w.SetExtension(ext, value)
		}
		if err != nil {
			return err
		}
	}
	if m.d.ContentType != "" {
		if err := w.SetAttribute(v.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.d.Body))
}

func (deliveryMessage) Finish(error) error { return nil }

// A consumer reads the messages of both CloudEvents formats with the
// CloudEvents SDK for Go, after the claimer has published them to
// RabbitMQ from FerretDB; an event that cannot be a CloudEvent, or whose
// envelope is too big, is FAILED with the reason.
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
			Headers: map[string]any{"tenant": "acme", "ce-id": "forged", "ce-subject": "forged"},
			Trace:   events.TraceContext{Parent: traceParent, State: traceState}},
		// Non-ASCII type and id, no aggregate, no trace.
		{ID: "bestellung-2-ändert", Type: "bestellung.geändert", Payload: payload},
	}
	// wantEvent is what the consumer must read of drafts[i].
	wantEvent := func(i int) cloudevents.Event {
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
			c, _ := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{
				Format: events.Format{Name: tt.format, Source: source, Prefix: events.PrefixKnative}, MaxBodyBytes: 1000})
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

			got := receive(t, r.deliveries, len(drafts))
			for i := range drafts {
				want := wantEvent(i)
				d, ok := got[want.ID()]
				if !ok {
					t.Errorf("no message for event %s", want.ID())
					continue
				}
				if d.ContentType != tt.contentType {
					t.Errorf("event %s: content type %q, want %q", want.ID(), d.ContentType, tt.contentType)
				}
				// The protocol's own trace context still travels.
				if got := d.Headers["traceparent"]; want.Extensions()["traceparent"] != nil && got != traceParent {
					t.Errorf("event %s: traceparent header %v, want %s", want.ID(), got, traceParent)
				}
				e, err := binding.ToEvent(t.Context(), deliveryMessage{d})
				if err != nil {
					t.Fatalf("event %s: the SDK cannot read the message: %v", want.ID(), err)
				}
				checkCloudEvent(t, e, want, wantData)
				if tt.format == events.FormatCloudEventsStructured {
					var plain cloudevents.Event
					if err := json.Unmarshal(d.Body, &plain); err != nil {
						t.Fatalf("event %s: json.Unmarshal of the envelope: %v", want.ID(), err)
					}
					checkCloudEvent(t, &plain, want, wantData)
				}
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

// receive returns n deliveries by message id, failing the test when they
// do not come within waitFor.
func receive(t *testing.T, deliveries <-chan amqp.Delivery, n int) map[string]amqp.Delivery {
	t.Helper()
	got := make(map[string]amqp.Delivery, n)
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	for len(got) < n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatal("deliveries closed")
			}
			got[d.MessageId] = d
		case <-deadline.C:
			t.Fatalf("received %d messages of %d", len(got), n)
		}
	}
	return got
}

// With tracing on, a CloudEvents message's traceparent header names the
// relay's publish span, while its tracing extension keeps naming the
// producer's span, the start of the event's trace.
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
		m, err := events.Format{Name: name, Source: "/outbox/shop/events", Prefix: events.PrefixKnative}.NewMessage(doc, 0)
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
		e, err := binding.ToEvent(t.Context(), deliveryMessage{amqp.Delivery{
			ContentType: sent.ContentType, Headers: amqp.Table(sent.Headers), Body: sent.Body}})
		if err != nil {
			t.Fatalf("%s: the SDK cannot read it: %v", sent.ContentType, err)
		}
		if got := e.Extensions()["traceparent"]; got != producerTraceParent {
			t.Errorf("%s: tracing extension %v, want the producer's %s", sent.ContentType, got, producerTraceParent)
		}
	}
}
