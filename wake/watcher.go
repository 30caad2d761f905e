package wake

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
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

// Watcher wakes the claimer on inserts of NEW events.
type Watcher struct {
	cfg  Config
	mode atomic.Value // string
	kick chan struct{}

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
	w := &Watcher{cfg: cfg, kick: make(chan struct{}, 1)}
	w.mode.Store(ModeStarting)
	return w, nil
}

// Mode says how the claimer is woken: ModeStarting until the first stream
// is open or refused, then ModeChangeStream, or ModePolling where change
// streams are not supported. A stream that failed and is being reopened
// reports ModeStarting again.
func (w *Watcher) Mode() string { return w.mode.Load().(string) }

// Start runs the watcher in the background and returns at once: the
// schedule covers the time until the stream is open.
func (w *Watcher) Start(ctx context.Context) error {
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		w.debounce(ctx)
	}()
	go func() {
		defer w.wg.Done()
		w.run(ctx)
	}()
	return nil
}

// Stop closes the stream and waits for the watcher to end. Idempotent;
// safe before Start.
func (w *Watcher) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() {
		if w.cancel != nil {
			w.cancel()
		}
	})
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

// pipeline matches inserts of NEW events and keeps only the resume token:
// the claim reads the events, the stream needs not carry them.
func pipeline() mongo.Pipeline {
	return mongo.Pipeline{
		{{Key: "$match", Value: bson.D{
			{Key: "operationType", Value: "insert"},
			{Key: "fullDocument." + events.FieldStatus, Value: events.StatusNew},
		}}},
		{{Key: "$project", Value: bson.D{{Key: "operationType", Value: 1}}}},
	}
}

// run opens the stream, notifies on every matching insert, and reopens the
// stream after an error with backoff, until ctx ends or the deployment
// turns out not to support change streams.
func (w *Watcher) run(ctx context.Context) {
	var token bson.Raw
	wait := backoff.Backoff{Min: w.cfg.BackoffMin, Max: w.cfg.BackoffMax, Jitter: true}
	opened := false // a stream has been open before
	for {
		opts := options.ChangeStream()
		if token != nil {
			opts.SetResumeAfter(token)
		}
		cs, err := w.cfg.Collection.Watch(ctx, pipeline(), opts)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && token != nil && !transient(err):
			// The server refuses to resume there (the oplog no longer holds
			// the token's event, or the token is not valid any more): start
			// afresh, and claim at once for whatever was inserted meanwhile.
			w.cfg.Logger.Warn("change stream cannot resume; reopening from now", "error", err)
			token = nil
			w.notify()
			continue
		case err != nil && unsupported(err):
			w.mode.Store(ModePolling)
			w.cfg.Logger.Info("change streams are not supported here (standalone server or FerretDB): claims run on the schedule only", "error", err)
			return
		case err != nil:
			w.mode.Store(ModeStarting)
			d := wait.Next()
			w.cfg.Logger.Warn("change stream not opened; retrying", "error", err, "retry_in", d.String())
			if !backoff.Sleep(ctx, d) {
				return
			}
			continue
		}
		w.mode.Store(ModeChangeStream)
		if !opened {
			w.cfg.Logger.Info("change stream open: claims wake on inserts of NEW events")
		} else {
			w.cfg.Logger.Info("change stream reopened")
		}
		if opened && token == nil {
			// Reopened from now: inserts while it was closed were not seen.
			w.notify()
		}
		opened = true
		for cs.Next(ctx) {
			wait.Reset() // a stream that delivers is healthy
			token = cs.ResumeToken()
			w.notify()
		}
		err = cs.Err()
		if t := cs.ResumeToken(); t != nil {
			token = t
		}
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = cs.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.mode.Store(ModeStarting)
		d := wait.Next()
		w.cfg.Logger.Warn("change stream closed; reopening", "error", err, "retry_in", d.String())
		if !backoff.Sleep(ctx, d) {
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
