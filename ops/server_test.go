package ops_test

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/service"
)

const waitTimeout = 10 * time.Second

var discard = slog.New(slog.DiscardHandler)

// fakeStore answers Ping and Stats with what the test sets.
type fakeStore struct {
	mu          sync.Mutex
	pingErr     error
	statsErr    error
	stats       events.Stats
	staleBefore time.Time // as last asked by Stats
	held        events.HeldStats
	heldErr     error // Held's own error, besides statsErr
	failedHolds bool  // as last asked by Held
}

func (s *fakeStore) Held(_ context.Context, _ time.Time, failedHolds bool) (events.HeldStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedHolds = failedHolds
	return s.held, cmp.Or(s.heldErr, s.statsErr)
}

func (s *fakeStore) Ping(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pingErr
}

func (s *fakeStore) Stats(_ context.Context, staleBefore time.Time) (events.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staleBefore = staleBefore
	return s.stats, s.statsErr
}

func (s *fakeStore) setStats(st events.Stats, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats, s.statsErr = st, err
}

func (s *fakeStore) setPingErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pingErr = err
}

func (s *fakeStore) lastStaleBefore() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.staleBefore
}

// fakeSamples is the sample the test sets, for /status.
type fakeSamples struct {
	mu     sync.Mutex
	sample *ops.Sample
}

func (f *fakeSamples) Latest() (ops.Sample, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sample == nil {
		return ops.Sample{}, false
	}
	return *f.sample, true
}

func (f *fakeSamples) set(s *ops.Sample) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sample = s
}

// switchBroker is a broker with an outage switch.
type switchBroker struct {
	mu  sync.Mutex
	err error
}

func (b *switchBroker) Ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *switchBroker) set(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = err
}

// fakeJob reports the last run the test sets and counts triggers; while
// backoff is set, a Wake runs nothing and returns it.
type fakeJob struct {
	last     atomic.Int64 // unix nanoseconds; 0 before the first run
	triggers atomic.Int32
	backoff  atomic.Int64 // a time.Duration
}

func (j *fakeJob) LastRun() time.Time {
	if n := j.last.Load(); n != 0 {
		return time.Unix(0, n).UTC()
	}
	return time.Time{}
}

func (j *fakeJob) Wake() time.Duration {
	if left := time.Duration(j.backoff.Load()); left > 0 {
		return left
	}
	j.triggers.Add(1)
	return 0
}

// wantTriggered fails t unless the job was woken n times by when.
func (j *fakeJob) wantTriggered(t *testing.T, n int32, when string) {
	t.Helper()
	if got := j.triggers.Load(); got != n {
		t.Errorf("%s: triggered %d times, want %d", when, got, n)
	}
}

// BatchLimit is a claimer's limit halved once after a timeout.
func (j *fakeJob) BatchLimit() int { return 250 }

// server is one started ops server and its parts.
type server struct {
	base     string // http://127.0.0.1:port
	store    *fakeStore
	samples  *fakeSamples
	broker   *switchBroker
	claimer  *fakeJob
	recovery *fakeJob
	registry *prometheus.Registry
}

// startServer starts an ops server on a free port with fake parts; edit
// cfg to replace some of them. It is stopped in t.Cleanup.
func startServer(t *testing.T, edit func(*ops.ServerConfig)) *server {
	t.Helper()
	s, srv := newServer(t, edit)
	testenv.Start(t, srv)
	s.base = "http://" + srv.Addr()
	return s
}

// newServer returns an ops server with fake parts, not started, and the
// parts; edit cfg to replace some of them.
func newServer(t *testing.T, edit func(*ops.ServerConfig)) (*server, *ops.Server) {
	t.Helper()
	s := &server{
		store:    &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{}}},
		samples:  &fakeSamples{},
		broker:   &switchBroker{},
		claimer:  &fakeJob{},
		recovery: &fakeJob{},
		registry: prometheus.NewRegistry(),
	}
	cfg := ops.ServerConfig{
		Addr:     "127.0.0.1:0",
		WorkerID: "host-a-42",
		Outboxes: []ops.Outbox{{
			Name:     "default",
			Store:    s.store,
			Broker:   s.broker,
			Samples:  s.samples,
			Claimer:  s.claimer,
			Recovery: s.recovery,
		}},
		Gatherer:  s.registry,
		Archetype: service.Archetype{Logger: discard},
	}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := ops.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, srv
}

// do sends a request and returns the status code and body.
func do(t *testing.T, method, url string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, body
}

// getJSON GETs url and decodes its JSON body into a map.
func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	code, body := do(t, http.MethodGet, url)
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("GET %s: body is not a JSON object: %v\n%s", url, err, body)
	}
	return code, m
}

// eventually waits until cond holds, failing the test with what.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, func() (bool, string) { return cond(), what })
}
