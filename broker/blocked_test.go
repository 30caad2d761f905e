package broker

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/events"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A connection.blocked from the broker (a memory or disk alarm) makes the
// publisher not ready, which pauses claiming, until connection.unblocked.
// The frames are handed to setBlocked as watch does; RabbitMQ's alarms
// cannot be raised here without blocking every other test's publishes.
func TestBlockedAlarmPausesPublishing(t *testing.T) {
	t.Parallel()
	p, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{}
	p.setSession(s, "") // connected, as far as Ready is concerned

	if err := p.Ready(); err != nil {
		t.Fatalf("Ready while connected = %v, want nil", err)
	}
	p.setBlocked(s, amqp.Blocking{Active: true, Reason: "low on memory"})
	err = p.Ready()
	if !errors.Is(err, events.ErrUnavailable) || !strings.Contains(err.Error(), "alarm") {
		t.Errorf("Ready while blocked = %v, want events.ErrUnavailable naming the alarm", err)
	}
	if _, err := p.readySession(); !errors.Is(err, events.ErrUnavailable) {
		t.Errorf("readySession while blocked = %v, want events.ErrUnavailable: no publish may start", err)
	}
	p.setBlocked(s, amqp.Blocking{Active: false})
	if err := p.Ready(); err != nil {
		t.Errorf("Ready after unblocked = %v, want nil", err)
	}

	// A new connection starts unblocked: the alarm belonged to the old one.
	p.setBlocked(s, amqp.Blocking{Active: true, Reason: "low on disk"})
	p.setSession(&session{}, "")
	if err := p.Ready(); err != nil {
		t.Errorf("Ready on a new connection after an alarm on the old = %v, want nil", err)
	}
}

// readySession never answers "ready" with no session, however the run loop
// swaps sessions meanwhile: Publish would take that nil for live.
func TestReadySessionIsNeverNil(t *testing.T) {
	t.Parallel()
	p, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20_000 {
			p.setSession(&session{}, "")
			p.setSession(nil, "")
		}
	}()
	for ready := 0; ; {
		select {
		case <-done:
			if ready == 0 {
				t.Log("no call found the publisher ready; the race was not exercised this run")
			}
			return
		default:
		}
		s, err := p.readySession()
		if err == nil {
			ready++
			if s == nil {
				t.Fatal("readySession returned no session and no error")
			}
		}
	}
}
