package wake

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
)

// Streams opens one change stream per database for every Watcher of a
// collection in it, instead of one per collection: a fleet of 200
// outboxes in 20 databases holds 20 streams (20 cursors, 20 getMores
// waiting on the server) rather than 200. The stream's filter names the
// watched collections; it is reopened, resuming where it was, when a
// watcher joins or leaves, opened with the first and closed with the
// last. Share one Streams between the watchers of a worker.
type Streams struct {
	cfg StreamsConfig
	mu  sync.Mutex
	dbs map[dbKey]*dbStream
}

// StreamsConfig configures Streams.
type StreamsConfig struct {
	// BackoffMin and BackoffMax bound the wait before reopening a failed
	// stream. Default to BackoffMinDefault and BackoffMaxDefault.
	BackoffMin, BackoffMax time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// dbKey names a database of one client: two clusters may have databases
// of the same name.
type dbKey struct {
	client *mongo.Client
	name   string
}

// NewStreams returns Streams that open nothing until a watcher joins.
func NewStreams(cfg StreamsConfig) *Streams {
	cfg.BackoffMin = cmp.Or(cfg.BackoffMin, BackoffMinDefault)
	cfg.BackoffMax = max(cmp.Or(cfg.BackoffMax, BackoffMaxDefault), cfg.BackoffMin)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return &Streams{cfg: cfg, dbs: map[dbKey]*dbStream{}}
}

// join adds notify for inserts into coll to its database's stream,
// starting the stream for the database's first watcher, and returns it.
// The stream runs on ctx's values, not its cancellation: the last
// watcher's leave ends it.
func (s *Streams) join(ctx context.Context, coll *mongo.Collection, notify func()) *dbStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := dbKey{coll.Database().Client(), coll.Database().Name()}
	st := s.dbs[key]
	if st == nil {
		st = newDBStream(ctx, coll.Database(), s.cfg)
		s.dbs[key] = st
	}
	st.add(coll.Name(), notify)
	return st
}

// leave removes coll's watcher from st; the last one out stops the stream
// and waits for it, until ctx ends.
func (s *Streams) leave(ctx context.Context, st *dbStream, coll string) error {
	s.mu.Lock()
	last := st.remove(coll)
	if last {
		delete(s.dbs, dbKey{st.db.Client(), st.db.Name()})
	}
	s.mu.Unlock()
	if !last {
		return nil
	}
	return st.stop(ctx)
}

// dbStream is the change stream of one database: inserts of NEW events
// into the watched collections, each notifying its collection's watcher.
type dbStream struct {
	db     *mongo.Database
	cfg    StreamsConfig
	logger *slog.Logger
	mode   atomic.Value // string, as Watcher.Mode

	mu   sync.Mutex
	subs map[string]func() // collection → its watcher's notify
	// changed asks the stream to reopen with the current collections.
	changed chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

func newDBStream(ctx context.Context, db *mongo.Database, cfg StreamsConfig) *dbStream {
	st := &dbStream{db: db, cfg: cfg, logger: cfg.Logger.With("database", db.Name()),
		subs: map[string]func(){}, changed: make(chan struct{}, 1), done: make(chan struct{})}
	st.mode.Store(ModeStarting)
	// The stream outlives the start of the watcher that opened it: it is
	// the last watcher's Stop that ends it.
	ctx, st.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(st.done)
		st.run(ctx)
	}()
	return st
}

// add watches coll, and asks the stream to reopen with it in its filter.
func (st *dbStream) add(coll string, notify func()) {
	st.mu.Lock()
	st.subs[coll] = notify
	st.mu.Unlock()
	st.reopen()
}

// remove stops watching coll and reports whether it was the last.
func (st *dbStream) remove(coll string) (last bool) {
	st.mu.Lock()
	delete(st.subs, coll)
	last = len(st.subs) == 0
	st.mu.Unlock()
	if !last {
		st.reopen()
	}
	return last
}

func (st *dbStream) reopen() {
	select {
	case st.changed <- struct{}{}:
	default:
	}
}

// stop ends the stream and waits for it until ctx ends.
func (st *dbStream) stop(ctx context.Context) error {
	st.cancel()
	select {
	case <-st.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watched returns the collections watched, sorted, and their notifies.
func (st *dbStream) watched() ([]string, map[string]func()) {
	st.mu.Lock()
	defer st.mu.Unlock()
	subs := maps.Clone(st.subs)
	return slices.Sorted(maps.Keys(subs)), subs
}

// notifyAll notifies every watcher: inserts may have gone unseen.
func notifyAll(subs map[string]func()) {
	for _, n := range subs {
		n()
	}
}

// dbPipeline matches inserts of NEW events into the collections colls and
// keeps the namespace (to tell whose) and the resume token: the claim
// reads the events, the stream needs not carry them.
func dbPipeline(colls []string) mongo.Pipeline {
	return mongo.Pipeline{
		{{Key: "$match", Value: bson.D{
			{Key: "operationType", Value: "insert"},
			{Key: "ns.coll", Value: bson.D{{Key: "$in", Value: colls}}},
			{Key: "fullDocument." + events.FieldStatus, Value: events.StatusNew},
		}}},
		{{Key: "$project", Value: bson.D{{Key: "operationType", Value: 1}, {Key: "ns", Value: 1}}}},
	}
}

// run opens the stream, notifies the watcher of each insert's collection,
// reopens it (resuming) when the watched collections change, and after an
// error with backoff, until ctx ends or the deployment turns out not to
// support change streams.
func (st *dbStream) run(ctx context.Context) {
	var token bson.Raw
	wait := backoff.Backoff{Min: st.cfg.BackoffMin, Max: st.cfg.BackoffMax, Jitter: true}
	opened := false
	for ctx.Err() == nil {
		select { // what is asked before the snapshot is in it
		case <-st.changed:
		default:
		}
		colls, subs := st.watched()
		streamCtx, endStream := context.WithCancel(ctx)
		changed := st.endOnChange(streamCtx, endStream)
		outcome, err := st.serve(streamCtx, colls, subs, &token, &opened, &wait)
		endStream()
		switch {
		case <-changed:
			// The watched collections changed: reopen at once, resuming.
		case ctx.Err() != nil || outcome == streamEnded:
			return
		case err != nil:
			st.mode.Store(ModeStarting)
			d := wait.Next()
			st.logger.Warn("change stream closed; reopening", "error", err, "retry_in", d.String())
			if !backoff.Sleep(ctx, d) {
				return
			}
		}
	}
}

// endOnChange ends the stream of streamCtx (with end) when the watched
// collections change; the channel it returns says, once streamCtx is
// done, whether that is why.
func (st *dbStream) endOnChange(streamCtx context.Context, end context.CancelFunc) <-chan bool {
	out := make(chan bool, 1)
	go func() {
		select {
		case <-st.changed:
			end()
			out <- true
		case <-streamCtx.Done():
			out <- false
		}
	}()
	return out
}

// streamOutcome is what serve tells run to do next.
type streamOutcome int

const (
	streamRetry streamOutcome = iota // reopen, after a backoff if err
	streamEnded                      // change streams are not supported: end
)

// serve opens the stream on colls and notifies until it ends; token is
// the resume token, kept across reopens.
func (st *dbStream) serve(ctx context.Context, colls []string, subs map[string]func(), token *bson.Raw, opened *bool, wait *backoff.Backoff) (streamOutcome, error) {
	opts := options.ChangeStream()
	if *token != nil {
		opts.SetResumeAfter(*token)
	}
	cs, err := st.open(ctx, colls, opts)
	switch {
	case ctx.Err() != nil:
		return streamRetry, nil
	case err != nil && *token != nil && !transient(err):
		st.logger.Warn("change stream cannot resume; reopening from now", "error", err)
		*token = nil
		notifyAll(subs)
		return streamRetry, nil
	case err != nil && unauthorized(err):
		// A role that grants changeStream on each outbox collection, as
		// deploy/mongodb/roles.js does, does not cover the stream of a
		// database of several outboxes: say so loudly, it is a setting
		// to fix, not a server's limit.
		st.mode.Store(ModePolling)
		st.logger.Warn("the change stream of the database is not authorized (it needs changeStream and find on the database): claims run on the schedule only", "error", err)
		return streamEnded, nil
	case err != nil && unsupported(err):
		st.mode.Store(ModePolling)
		st.logger.Info("change streams are not supported here (standalone server or FerretDB): claims run on the schedule only", "error", err)
		return streamEnded, nil
	case err != nil:
		return streamRetry, err
	}
	st.mode.Store(ModeChangeStream)
	if !*opened {
		st.logger.Info("change stream open: claims wake on inserts of NEW events", "collections", len(colls))
	} else if *token == nil {
		notifyAll(subs) // reopened from now: inserts while closed were not seen
	}
	*opened = true
	for cs.Next(ctx) {
		wait.Reset() // a stream that delivers is healthy
		*token = cs.ResumeToken()
		coll, _ := cs.Current.Lookup("ns", "coll").StringValueOK()
		if notify := subs[coll]; notify != nil {
			notify()
		}
	}
	err = cs.Err()
	if t := cs.ResumeToken(); t != nil {
		*token = t
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = cs.Close(closeCtx)
	cancel()
	if ctx.Err() != nil {
		return streamRetry, nil
	}
	return streamRetry, err
}

// open opens the stream: on the collection while it is the database's
// only watched one, otherwise on the database. A database of one outbox
// (every deployment of one outbox) so needs no more privilege than the
// collection's changeStream and find, which the least-privilege role of
// deploy/mongodb/roles.js grants; only a database of several outboxes
// needs them on the database. A resume token of one kind of stream that
// the other cannot resume from is met as any token that cannot resume.
func (st *dbStream) open(ctx context.Context, colls []string, opts *options.ChangeStreamOptionsBuilder) (*mongo.ChangeStream, error) {
	if len(colls) == 1 {
		return st.db.Collection(colls[0]).Watch(ctx, dbPipeline(colls), opts)
	}
	return st.db.Watch(ctx, dbPipeline(colls), opts)
}

// unauthorized reports whether the server refused the stream for want of
// a privilege (Unauthorized, code 13).
func unauthorized(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(13)
}
