package broker

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestWatchKnowsCloseBeforeItRuns has the broker close a session's channel
// over a message before the session's watcher has run, as a busy host
// allows: connect starts the watcher in a goroutine and hands the session
// out at once, and a poison publish closes the channel within a
// millisecond. The watcher must still end the session with the broker's
// 406, for only that close sends a window's messages to isolation; a
// close without its cause is an outage, and the whole window would go
// back to NEW with its poison, forever.
//
// The library tells a listener registered after the close nothing but a
// closed channel, so this holds only if open registers the listeners.
func TestWatchKnowsCloseBeforeItRuns(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	testenv.Consume(t, url, exchange)
	p, err := New(Config{URL: url, Exchange: exchange, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	conn := testenv.Dial(t, url)
	s, err := p.open(conn)
	if err != nil {
		t.Fatal(err)
	}

	poison := amqp.Publishing{MessageId: "poison", Headers: amqp.Table{"CC": "audit"}}
	if err := s.ch.PublishWithContext(t.Context(), exchange, "order.created", false, false, poison); err != nil {
		t.Fatalf("publish the poison: %v", err)
	}
	// The library closes a channel's return listeners last, under the lock
	// a new close listener takes: once they are closed, the channel is
	// closed for good and its close told to whoever listened.
	deadline := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-s.returns:
		case <-deadline:
			t.Fatal("the broker did not close the channel over a CC header that is not an array")
		}
	}

	p.watchers.Add(1)
	go p.watch(t.Context(), s)
	select {
	case <-s.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not end a session whose channel is closed")
	}
	p.watchers.Wait()
	var ae *amqp.Error
	if !errors.As(s.cause, &ae) || ae.Code != amqp.PreconditionFailed || !poisonClose(s.cause) {
		t.Errorf("session ended with %v; want the broker's 406 close, which poisonClose counts as poison", s.cause)
	}
}

// TestWatchPrefersCloseCauseToBlockedEnd ends a connection as the library
// does once the watcher runs late: the close's error waits in its
// listener while the alarm listener is already closed. The session must
// end with the error, every time, not with a cause-less "connection
// closed" that select chose at random: a 501 that one message caused
// would otherwise count as an outage about one time in two.
func TestWatchPrefersCloseCauseToBlockedEnd(t *testing.T) {
	t.Parallel()
	p, err := New(Config{URL: "amqp://localhost/", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	frameErr := &amqp.Error{Code: amqp.FrameError, Reason: "frame too large", Server: true}
	for i := range 200 {
		s := &session{
			connClosed: make(chan *amqp.Error, 1),
			chClosed:   make(chan *amqp.Error, 1),
			blocked:    make(chan amqp.Blocking),
			closed:     make(chan struct{}),
		}
		s.connClosed <- frameErr
		close(s.connClosed)
		close(s.blocked)
		p.watchers.Add(1)
		p.watch(t.Context(), s)
		if !errors.Is(s.cause, frameErr) {
			t.Fatalf("try %d: session ended with %v; want the connection's 501 close", i, s.cause)
		}
	}
}

// TestStaleAlarmDoesNotBlockNewSession hands the watcher of a session
// that has ended, and been replaced, an alarm the old connection sent
// before it went: on a busy host the watcher can run that late. The alarm
// belonged to the old connection; the broker tells the new one its own
// alarms (and their end). Taken for the new session's, it would pause
// publishing until the new connection drops, which may be never.
func TestStaleAlarmDoesNotBlockNewSession(t *testing.T) {
	t.Parallel()
	p, err := New(Config{URL: "amqp://localhost/", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		old := &session{
			connClosed: make(chan *amqp.Error, 1),
			chClosed:   make(chan *amqp.Error, 1),
			blocked:    make(chan amqp.Blocking, 1),
			closed:     make(chan struct{}),
		}
		old.blocked <- amqp.Blocking{Active: true, Reason: "low on memory"}
		old.end(errRetired)
		p.setSession(&session{closed: make(chan struct{})}, "")
		p.watchers.Add(1)
		p.watch(t.Context(), old)
		if err := p.Ready(); err != nil {
			t.Fatalf("try %d: Ready on the new session after the old one's alarm = %v, want nil", i, err)
		}
	}
}
