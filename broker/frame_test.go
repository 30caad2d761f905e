package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// recordingConn keeps a copy of everything the client writes.
type recordingConn struct {
	net.Conn
	mu  sync.Mutex
	out []byte
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.out = append(c.out, p...)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// contentHeaderSizes parses the frames a client wrote (after the protocol
// header) and returns the payload size of each content header frame.
func (c *recordingConn) contentHeaderSizes(t *testing.T) []int {
	t.Helper()
	c.mu.Lock()
	b := append([]byte(nil), c.out...)
	c.mu.Unlock()
	if len(b) < 8 || string(b[:4]) != "AMQP" {
		t.Fatalf("client output does not start with the AMQP protocol header")
	}
	b = b[8:]
	var sizes []int
	for len(b) > 0 {
		if len(b) < 7 {
			t.Fatalf("truncated frame header: % x", b)
		}
		typ, size := b[0], int(binary.BigEndian.Uint32(b[3:7]))
		if len(b) < 7+size+1 || b[7+size] != 0xCE {
			t.Fatalf("frame of type %d and size %d does not end where it should", typ, size)
		}
		if typ == 2 {
			sizes = append(sizes, size)
		}
		b = b[7+size+1:]
	}
	return sizes
}

// TestContentHeaderSizeMatchesWire publishes messages with every kind of
// header value through amqp091-go to RabbitMQ and checks that
// contentHeaderSize predicts each content header frame the library wrote.
func TestContentHeaderSizeMatchesWire(t *testing.T) {
	t.Parallel()
	var rec *recordingConn
	amqpURL := testenv.AMQPURL(t)
	// RabbitMQ refuses a user_id other than the connection's own user:
	// guest locally, another in the container suite.
	uri, err := amqp.ParseURI(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := amqp.DefaultDial(5*time.Second)(network, addr)
			if err != nil {
				return nil, err
			}
			rec = &recordingConn{Conn: c}
			return rec, nil
		},
	})
	if err != nil {
		t.Fatalf("dial RabbitMQ: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}

	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	every := amqp.Table{
		"s": "text", "i32": int32(-7), "i64": int64(1) << 40, "f64": 0.5, "t": true, "f": false,
		"at": at, "none": nil, "raw": []byte{0, 1, 2},
		"list":   []any{"a", int32(1), []any{}, amqp.Table{"k": "v"}},
		"nested": amqp.Table{"deeper": amqp.Table{"x": int64(1)}, "empty": amqp.Table{}},
		// Types the events package does not produce, but amqp091-go encodes.
		"int": 3, "i8": int8(-1), "u8": byte(1), "i16": int16(-2), "u16": uint16(2), "u32": uint32(3),
		"f32": float32(1.5), "dec": amqp.Decimal{Scale: 2, Value: 1234},
	}
	contract := publishing(events.Message{ID: "event-1", Type: "order.created", Timestamp: at, Body: []byte(`{}`)})
	contract.Headers = every
	pubs := map[string]amqp.Publishing{
		"the message contract, every header type": contract,
		"no properties at all":                    {Body: []byte("x")},
		"every property": {
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 9,
			CorrelationId: "c", ReplyTo: "r", Expiration: "60000", MessageId: strings.Repeat("m", 255),
			Timestamp: at, Type: "t", UserId: uri.Username, AppId: "a", Headers: every,
		},
		"a large header": {Headers: amqp.Table{"big": strings.Repeat("b", 100_000)}},
	}

	for name, pub := range pubs {
		want, err := contentHeaderSize(pub)
		if err != nil {
			t.Fatalf("%s: contentHeaderSize: %v", name, err)
		}
		before := len(rec.contentHeaderSizes(t))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "amq.topic", "nobody.listens", false, false, pub)
		if err != nil {
			cancel()
			t.Fatalf("%s: publish: %v", name, err)
		}
		acked, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !acked {
			t.Fatalf("%s: confirm: acked %t, %v", name, acked, err)
		}
		sizes := rec.contentHeaderSizes(t)
		if len(sizes) != before+1 {
			t.Fatalf("%s: %d content header frames written, want %d", name, len(sizes), before+1)
		}
		if got := sizes[len(sizes)-1]; got != want {
			t.Errorf("%s: amqp091-go wrote a content header of %d bytes, contentHeaderSize says %d", name, got, want)
		}
	}
}

func TestCheckContentHeader(t *testing.T) {
	t.Parallel()
	const frameMax = 4096
	pub := amqp.Publishing{Headers: amqp.Table{"pad": ""}}
	base, err := contentHeaderSize(pub)
	if err != nil {
		t.Fatal(err)
	}
	fits := amqp.Publishing{Headers: amqp.Table{"pad": strings.Repeat("p", frameMax-frameOverhead-base)}}
	over := amqp.Publishing{Headers: amqp.Table{"pad": strings.Repeat("p", frameMax-frameOverhead-base+1)}}

	if err := checkContentHeader(fits, frameMax); err != nil {
		t.Errorf("a content header of exactly frame_max - 8 bytes: %v, want it to fit", err)
	}
	if err := checkContentHeader(over, 0); err != nil {
		t.Errorf("frame_max 0 (unlimited): %v, want no bound", err)
	}
	err = checkContentHeader(over, frameMax)
	var invalid *events.InvalidError
	if !errors.As(err, &invalid) || invalid.Field != events.FieldHeaders {
		t.Fatalf("one byte over: %v, want *events.InvalidError on %q", err, events.FieldHeaders)
	}
	for _, want := range []string{"4089 bytes", "4096 bytes", "4088"} {
		if !strings.Contains(invalid.Reason, want) {
			t.Errorf("reason %q does not mention %q", invalid.Reason, want)
		}
	}

	err = checkContentHeader(amqp.Publishing{Headers: amqp.Table{"ch": make(chan int)}}, frameMax)
	if !errors.As(err, &invalid) || !strings.Contains(invalid.Reason, "headers.ch") {
		t.Errorf("a header of a type AMQP cannot carry: %v, want *events.InvalidError naming headers.ch", err)
	}
}

// TestPublishFrameSizeBound publishes, in one window, a message whose
// content header is exactly as large as the negotiated frame size allows
// and one a byte larger: the first is confirmed and delivered, the second
// fails as poison without being sent, and does not disturb the rest.
func TestPublishFrameSizeBound(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, url, exchange)
	p, err := New(Config{URL: url, Exchange: exchange, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, p)
	s, err := p.readySession()
	if err != nil {
		t.Fatal(err)
	}
	if s.frameMax <= 0 {
		t.Fatalf("negotiated frame size %d, want RabbitMQ's bound", s.frameMax)
	}

	sized := func(id string, size int) events.Message {
		m := events.Message{ID: id, Type: "order.created", Timestamp: time.Now(), Body: []byte(`{}`),
			Headers: map[string]any{"pad": ""}}
		base, err := contentHeaderSize(publishing(m))
		if err != nil {
			t.Fatal(err)
		}
		m.Headers["pad"] = strings.Repeat("p", size-base)
		return m
	}
	limit := s.frameMax - frameOverhead
	msgs := []events.Message{
		sized("at-limit", limit),
		sized("over-limit", limit+1),
		sized("small", 100),
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("messages that fit: %v and %v, want both confirmed", errs[0], errs[2])
	}
	var invalid *events.InvalidError
	if !errors.As(errs[1], &invalid) || invalid.Field != events.FieldHeaders {
		t.Fatalf("message one byte over the frame size: %v, want *events.InvalidError on headers", errs[1])
	}
	t.Logf("over the bound: %v", errs[1])

	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case d := <-deliveries:
			got[d.MessageId] = true
		case <-ctx.Done():
			t.Fatalf("delivered %v, want at-limit and small", got)
		}
	}
	if !got["at-limit"] || !got["small"] {
		t.Errorf("delivered %v, want at-limit and small", got)
	}
	if err := p.Ready(); err != nil {
		t.Errorf("Ready after the refused message: %v; nothing should have closed", err)
	}
}
