package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/events"
)

// arrived is a confirmation that has already come.
type arrived struct {
	done chan struct{}
	ack  bool
}

func newArrived(ack bool) arrived {
	c := arrived{done: make(chan struct{}), ack: ack}
	close(c.done)
	return c
}

func (c arrived) Done() <-chan struct{} { return c.done }
func (c arrived) Acked() bool           { return c.ack }

// A confirm that arrived before the context ended is reported, every time:
// choosing at random between the two would publish again about half of
// the messages confirmed in time.
func TestWaitConfirmPrefersArrivedConfirm(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for _, ack := range []bool{true, false} {
		c := newArrived(ack)
		for i := range 1000 {
			got, ok := waitConfirm(ctx, c)
			if !ok || got != ack {
				t.Fatalf("try %d: waitConfirm with an arrived confirm (ack %t) and an ended context = %t, %t; want %t, true",
					i, ack, got, ok, ack)
			}
		}
	}

	pending := arrived{done: make(chan struct{})}
	if _, ok := waitConfirm(ctx, pending); ok {
		t.Errorf("waitConfirm without a confirm and with an ended context: ok, want not ok")
	}
}

func TestPoisonClose(t *testing.T) {
	t.Parallel()
	server := func(code int) error {
		return closeCause("channel", &amqp.Error{Code: code, Reason: "x", Server: true})
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"406 precondition failed (a CC header that is not an array)", server(amqp.PreconditionFailed), true},
		{"501 frame error (a frame over frame_max)", closeCause("connection", &amqp.Error{Code: amqp.FrameError, Server: true}), true},
		{"502 syntax error", server(amqp.SyntaxError), true},
		{"503 command invalid", server(amqp.CommandInvalid), true},
		{"505 unexpected frame", server(amqp.UnexpectedFrame), true},
		{"540 not implemented", server(amqp.NotImplemented), true},
		{"320 connection forced (an operator or a node shutting down)", server(amqp.ConnectionForced), false},
		{"404 not found (the exchange was deleted)", server(amqp.NotFound), false},
		{"541 internal error", server(amqp.InternalError), false},
		{"501 from the client: the socket failed", closeCause("connection", &amqp.Error{Code: amqp.FrameError, Server: false}), false},
		{"closed without an error", closeCause("channel", nil), false},
		{"a network error", fmt.Errorf("write to the broker: %w", errors.New("broken pipe")), false},
		{"retired", errRetired, false},
	}
	for _, tt := range tests {
		if got := poisonClose(tt.err); got != tt.want {
			t.Errorf("%s: poisonClose(%v) = %t, want %t", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestTable checks the headers the encoder gets: nested maps become
// amqp.Table at every depth, inside arrays too, and the other values stay
// as they are.
func TestTable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		in   map[string]any
		want amqp.Table
	}{
		{"none", nil, nil},
		{"flat", map[string]any{"x-aggregate-id": "o-1", "n": int32(1)}, amqp.Table{"x-aggregate-id": "o-1", "n": int32(1)}},
		{"nested", map[string]any{
			"m": map[string]any{"k": map[string]any{"d": "v"}},
			"a": []any{"s", map[string]any{"k": "v"}, []any{map[string]any{}}},
		}, amqp.Table{
			"m": amqp.Table{"k": amqp.Table{"d": "v"}},
			"a": []any{"s", amqp.Table{"k": "v"}, []any{amqp.Table{}}},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, table(tt.in)); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

// A message's content type becomes the property; a message that names
// none (made by hand) is the contract's application/json.
func TestPublishingContentType(t *testing.T) {
	t.Parallel()
	for give, want := range map[string]string{
		"":                            events.ContentType,
		events.ContentType:            "application/json",
		events.ContentTypeCloudEvents: "application/cloudevents+json",
	} {
		if got := publishing(events.Message{ID: "e", Type: "t", ContentType: give}).ContentType; got != want {
			t.Errorf("Message.ContentType %q: content_type %q, want %q", give, got, want)
		}
	}
}
