package wake

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/rule"
)

const (
	// DebounceDefault is the least time between two triggers: a burst of
	// inserts wakes the claimer once, and the claim drains the burst.
	DebounceDefault = 50 * time.Millisecond
	// BackoffMinDefault is the first wait before reopening a stream that
	// failed.
	BackoffMinDefault = 500 * time.Millisecond
	// BackoffMaxDefault caps the wait between reopens.
	BackoffMaxDefault = 30 * time.Second
)

// Modes that Mode reports.
const (
	ModeStarting     = "starting"
	ModeChangeStream = "change stream"
	ModePolling      = "polling"
)

// Config configures a Watcher.
type Config struct {
	// Collection is the outbox collection. Required.
	Collection *mongo.Collection
	// Trigger wakes the claimer; it must not block (claim.Claimer.Trigger
	// does not). Required.
	Trigger func()
	// Debounce is the least time between two calls of Trigger. Defaults
	// to DebounceDefault.
	Debounce time.Duration
	// BackoffMin and BackoffMax bound the wait before reopening a failed
	// stream. Default to BackoffMinDefault and BackoffMaxDefault.
	BackoffMin, BackoffMax time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Streams, when set, is the change streams the watcher shares with
	// the others of the worker: one per database (see Streams). Defaults
	// to nil: the watcher opens a stream of its own.
	Streams *Streams
}

func (c *Config) setDefaults() {
	c.Debounce = cmp.Or(c.Debounce, DebounceDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, BackoffMaxDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// Validate reports the first bad field, naming it and its value. New calls
// it after filling the defaults, so a zero value is never bad there.
func (c Config) Validate() error {
	return rule.First("wake",
		rule.Required("Collection", c.Collection != nil),
		rule.Required("Trigger", c.Trigger != nil),
		rule.Above("Debounce", c.Debounce, 0),
		rule.Above("BackoffMin", c.BackoffMin, 0),
		rule.AtLeastField("BackoffMax", c.BackoffMax, "BackoffMin", c.BackoffMin),
	)
}

// Watcher wakes the claimer on inserts of NEW events, through its
// database's change stream (Streams).
type Watcher struct {
	cfg    Config
	stream atomic.Pointer[dbStream] // while started
	kick   chan struct{}

	stopOnce sync.Once
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// New returns a Watcher; Start runs it.
func New(cfg Config) (*Watcher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Streams == nil {
		cfg.Streams = NewStreams(StreamsConfig{BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax, Logger: cfg.Logger})
	}
	return &Watcher{cfg: cfg, kick: make(chan struct{}, 1)}, nil
}

// Mode says how the claimer is woken: ModeStarting until the first stream
// is open or refused, then ModeChangeStream, or ModePolling where change
// streams are not supported. A stream that failed and is being reopened
// reports ModeStarting again.
func (w *Watcher) Mode() string {
	st := w.stream.Load()
	if st == nil {
		return ModeStarting
	}
	return st.mode.Load().(string)
}

// Start runs the watcher in the background and returns at once: the
// schedule covers the time until the stream is open.
func (w *Watcher) Start(ctx context.Context) error {
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.debounce(ctx)
	}()
	w.stream.Store(w.cfg.Streams.join(ctx, w.cfg.Collection, w.notify))
	return nil
}

// Stop leaves the database's stream (the last watcher to leave closes
// it) and waits for the watcher to end. Idempotent; safe before Start.
func (w *Watcher) Stop(ctx context.Context) error {
	var err error
	w.stopOnce.Do(func() {
		if w.cancel != nil {
			w.cancel()
		}
		if st := w.stream.Load(); st != nil {
			err = w.cfg.Streams.leave(ctx, st, w.cfg.Collection.Name())
		}
	})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// notify asks for a trigger; one already pending absorbs it.
func (w *Watcher) notify() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// debounce calls Trigger for a notification, then waits Debounce before
// the next: a notification meanwhile waits its turn (one is kept), so
// none is lost and Trigger runs at most once per Debounce.
func (w *Watcher) debounce(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		w.cfg.Trigger()
		if !backoff.Sleep(ctx, w.cfg.Debounce) {
			return
		}
	}
}

// transientCodes are server errors that a failover, a shutdown or a slow
// server give: the deployment supports change streams, it cannot serve one
// at the moment.
var transientCodes = map[int]bool{
	6: true, 7: true, 89: true, 91: true, 133: true, 189: true, 234: true,
	262: true, 9001: true, 10107: true, 11600: true, 11602: true,
	13435: true, 13436: true, 63: true, 150: true, 13388: true,
}

// transient reports whether err is one that passes: a network error, a
// timeout, a failover, a server shutting down.
func transient(err error) bool {
	if mongo.IsNetworkError(err) || mongo.IsTimeout(err) {
		return true
	}
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return true // not the server's answer: try again
	}
	for code := range transientCodes {
		if se.HasErrorCode(code) {
			return true
		}
	}
	return se.HasErrorLabel("RetryableReadError") || se.HasErrorLabel("ResumableChangeStreamError")
}

// unsupported reports whether opening a stream failed because the server
// refused the command itself, as a standalone server (code 40573) or
// FerretDB (which does not know $changeStream) does, rather than for a
// reason that passes. Support is found by trying, not by the server's
// name, so a server that gains it is used.
func unsupported(err error) bool { return !transient(err) }
