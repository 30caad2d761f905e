package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
)

const waitTimeout = 10 * time.Second

var discard = slog.New(slog.DiscardHandler)

// fakeStore answers Ping and Stats with what the test sets.
type fakeStore struct {
	mu          sync.Mutex
	pingErr     error
	statsErr    error
	stats       mongo.Stats
	staleBefore time.Time // as last asked by Stats
	held        mongo.HeldStats
	failedHolds bool // as last asked by Held
}

func (s *fakeStore) Held(_ context.Context, _ time.Time, failedHolds bool) (mongo.HeldStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedHolds = failedHolds
	return s.held, s.statsErr
}

func (s *fakeStore) Ping(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pingErr
}

func (s *fakeStore) Stats(_ context.Context, staleBefore time.Time) (mongo.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staleBefore = staleBefore
	return s.stats, s.statsErr
}

func (s *fakeStore) setStats(st mongo.Stats, err error) {
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

// fakeJob reports the last run the test sets and counts triggers.
type fakeJob struct {
	last     atomic.Int64 // unix nanoseconds; 0 before the first run
	triggers atomic.Int32
}

func (j *fakeJob) LastRun() time.Time {
	if n := j.last.Load(); n != 0 {
		return time.Unix(0, n).UTC()
	}
	return time.Time{}
}

func (j *fakeJob) Trigger() { j.triggers.Add(1) }

// server is one started ops server and its parts.
type server struct {
	base     string // http://127.0.0.1:port
	store    *fakeStore
	broker   *switchBroker
	claimer  *fakeJob
	recovery *fakeJob
	registry *prometheus.Registry
}

// startServer starts an ops server on a free port with fake parts; edit
// cfg to replace some of them. It is stopped in t.Cleanup.
func startServer(t *testing.T, edit func(*ops.ServerConfig)) *server {
	t.Helper()
	s := &server{
		store:    &fakeStore{stats: mongo.Stats{Counts: map[events.Status]int64{}}},
		broker:   &switchBroker{},
		claimer:  &fakeJob{},
		recovery: &fakeJob{},
		registry: prometheus.NewRegistry(),
	}
	cfg := ops.ServerConfig{
		Addr:       "127.0.0.1:0",
		WorkerID:   "host-a-42",
		Store:      s.store,
		Broker:     s.broker,
		StaleAfter: time.Minute,
		Claimer:    s.claimer,
		Recovery:   s.recovery,
		Gatherer:   s.registry,
		Logger:     discard,
	}
	if edit != nil {
		edit(&cfg)
	}
	srv := ops.NewServer(cfg)
	if err := srv.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	s.base = "http://" + srv.Addr()
	return s
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

func TestHealthzIgnoresDependencies(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	// Liveness must not depend on the database or the broker: a worker
	// waiting for them is alive, and restarting it would not help.
	s.store.setPingErr(errors.New("connection refused"))
	s.broker.set(events.ErrUnavailable)

	code, body := getJSON(t, s.base+"/healthz")
	if code != http.StatusOK {
		t.Errorf("GET /healthz = %d, want 200", code)
	}
	if body["workerId"] != "host-a-42" {
		t.Errorf("GET /healthz workerId = %v, want host-a-42", body["workerId"])
	}
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		pingErr    error
		brokerErr  error
		wantCode   int
		wantReason string // prefix; empty when ready
	}{
		{name: "both up", wantCode: http.StatusOK},
		{name: "database down", pingErr: errors.New("server selection timeout"), wantCode: http.StatusServiceUnavailable, wantReason: "mongodb: server selection timeout"},
		{name: "broker down", brokerErr: fmt.Errorf("%w: not connected", events.ErrUnavailable), wantCode: http.StatusServiceUnavailable, wantReason: "rabbitmq: broker unavailable: not connected"},
		{name: "broker blocked", brokerErr: fmt.Errorf("%w: blocked by a broker alarm", events.ErrUnavailable), wantCode: http.StatusServiceUnavailable, wantReason: "rabbitmq: broker unavailable: blocked"},
		{name: "both down", pingErr: errors.New("ping failed"), brokerErr: events.ErrUnavailable, wantCode: http.StatusServiceUnavailable, wantReason: "mongodb: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, nil)
			s.store.setPingErr(tt.pingErr)
			s.broker.set(tt.brokerErr)

			code, body := getJSON(t, s.base+"/readyz")
			if code != tt.wantCode {
				t.Errorf("GET /readyz = %d, want %d (body %v)", code, tt.wantCode, body)
			}
			if body["ready"] != (tt.wantCode == http.StatusOK) {
				t.Errorf("ready = %v, want %t", body["ready"], tt.wantCode == http.StatusOK)
			}
			reason, _ := body["reason"].(string)
			if tt.wantReason == "" && body["reason"] != nil {
				t.Errorf("reason = %v, want none when ready", body["reason"])
			}
			if !strings.HasPrefix(reason, tt.wantReason) {
				t.Errorf("reason = %q, want prefix %q", reason, tt.wantReason)
			}
		})
	}
}

// TestReadyzFollowsSwitch flips the fakes on one server: readiness is
// checked on every request, not cached.
func TestReadyzFollowsSwitch(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	steps := []struct {
		pingErr, brokerErr error
		want               int
	}{
		{nil, nil, http.StatusOK},
		{nil, events.ErrUnavailable, http.StatusServiceUnavailable},
		{nil, nil, http.StatusOK},
		{errors.New("down"), nil, http.StatusServiceUnavailable},
		{nil, nil, http.StatusOK},
	}
	for i, st := range steps {
		s.store.setPingErr(st.pingErr)
		s.broker.set(st.brokerErr)
		if code, _ := do(t, http.MethodGet, s.base+"/readyz"); code != st.want {
			t.Errorf("step %d: GET /readyz = %d, want %d", i, code, st.want)
		}
	}
}

// TestReadyzDuringBrokerOutage puts a real Publisher behind a proxy and
// cuts it: /readyz turns 503 naming rabbitmq, and 200 after Restore.
func TestReadyzDuringBrokerOutage(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	// Registered first, so it runs after the publisher has stopped.
	t.Cleanup(func() { deleteExchange(t, amqpURL, exchange) })
	proxied, proxy := testenv.Proxied(t, amqpURL)
	pub, err := broker.New(broker.Config{
		URL: proxied, Exchange: exchange, Logger: discard,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := pub.Stop(ctx); err != nil {
			t.Errorf("publisher Stop: %v", err)
		}
	})
	s := startServer(t, func(cfg *ops.ServerConfig) { cfg.Broker = pub })
	cutAndRestore(t, s, proxy, "rabbitmq: ")
}

// TestReadyzDuringDatabaseOutage puts a real store behind a proxy and cuts
// it: /readyz turns 503 naming mongodb, and 200 after Restore.
func TestReadyzDuringDatabaseOutage(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t) // direct: created here, dropped at cleanup
	client, proxy := testenv.ProxiedClient(t)
	store := mongo.New(client, mongo.Config{Database: db.Name(), Logger: discard})
	s := startServer(t, func(cfg *ops.ServerConfig) { cfg.Store = store })
	cutAndRestore(t, s, proxy, "mongodb: ")
}

// cutAndRestore checks /readyz through an outage of the link proxy
// carries: 200 before, 503 with a reason starting with prefix during,
// and 200 again after Restore.
func cutAndRestore(t *testing.T, s *server, proxy *testenv.Proxy, prefix string) {
	t.Helper()
	waitReadyz(t, s, "before the cut", http.StatusOK)
	proxy.Cut()
	body := waitReadyz(t, s, "during the cut", http.StatusServiceUnavailable)
	if reason, _ := body["reason"].(string); !strings.HasPrefix(reason, prefix) || body["ready"] != false {
		t.Errorf("/readyz during the cut = %v, want ready false and a reason starting with %q", body, prefix)
	}
	restored := time.Now()
	proxy.Restore()
	waitReadyz(t, s, "after Restore", http.StatusOK)
	t.Logf("/readyz 200 again %s after Restore", time.Since(restored).Round(time.Millisecond))
}

// waitReadyz polls /readyz until it answers want, and returns its body.
func waitReadyz(t *testing.T, s *server, what string, want int) map[string]any {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		code, body := getJSON(t, s.base+"/readyz")
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: GET /readyz = %d %v, want %d within %s", what, code, body, want, waitTimeout)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

func deleteExchange(t *testing.T, amqpURL, exchange string) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Errorf("delete exchange %s: %v", exchange, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("delete exchange %s: %v", exchange, err)
		return
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Errorf("delete exchange %s: %v", exchange, err)
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	now := time.Now().UTC()
	lastClaim := now.Add(-2 * time.Second).Truncate(time.Millisecond)
	s.claimer.last.Store(lastClaim.UnixNano())
	// The recovery job has not run yet: lastRecoveryAt is null.
	stats := mongo.Stats{
		// No PROCESSING entry: the body still lists it, as 0.
		Counts:    map[events.Status]int64{events.StatusNew: 5, events.StatusPublished: 10, events.StatusFailed: 1},
		OldestNew: now.Add(-90 * time.Second),
		Stale:     3,
	}
	s.store.setStats(stats, nil)

	code, body := getJSON(t, s.base+"/status")
	if code != http.StatusOK {
		t.Fatalf("GET /status = %d, want 200 (body %v)", code, body)
	}
	wantKeys := []string{"counts", "heldAggregates", "lastClaimAt", "lastRecoveryAt", "oldestHeldAgeSeconds", "oldestNewAgeSeconds", "staleProcessing", "workerId"}
	if diff := cmp.Diff(wantKeys, slices.Sorted(maps.Keys(body))); diff != "" {
		t.Errorf("GET /status fields (-want +got):\n%s", diff)
	}
	wantCounts := map[string]any{"NEW": 5.0, "PROCESSING": 0.0, "PUBLISHED": 10.0, "FAILED": 1.0}
	if diff := cmp.Diff(wantCounts, body["counts"]); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if body["workerId"] != "host-a-42" {
		t.Errorf("workerId = %v, want host-a-42", body["workerId"])
	}
	if age, _ := body["oldestNewAgeSeconds"].(float64); age < 90 || age > 100 {
		t.Errorf("oldestNewAgeSeconds = %v, want about 90", body["oldestNewAgeSeconds"])
	}
	if body["staleProcessing"] != 3.0 {
		t.Errorf("staleProcessing = %v, want 3", body["staleProcessing"])
	}
	if got, _ := body["lastClaimAt"].(string); got != lastClaim.Format(time.RFC3339Nano) {
		t.Errorf("lastClaimAt = %v, want %s", body["lastClaimAt"], lastClaim.Format(time.RFC3339Nano))
	}
	if body["lastRecoveryAt"] != nil {
		t.Errorf("lastRecoveryAt = %v, want null before the first recovery", body["lastRecoveryAt"])
	}
	// Stale means claimed more than StaleAfter (1m) ago.
	if d := now.Add(-time.Minute).Sub(s.store.lastStaleBefore()); d < -5*time.Second || d > 5*time.Second {
		t.Errorf("Stats asked with staleBefore %s, want about now - 1m (%s)", s.store.lastStaleBefore(), now.Add(-time.Minute))
	}

	s.store.setStats(mongo.Stats{}, errors.New("count NEW events: timeout"))
	if code, _ := do(t, http.MethodGet, s.base+"/status"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /status with the database down = %d, want 503", code)
	}
}

func TestTrigger(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if code, _ := do(t, http.MethodPost, s.base+"/trigger"); code != http.StatusAccepted {
		t.Errorf("POST /trigger = %d, want 202", code)
	}
	if got := s.claimer.triggers.Load(); got != 1 {
		t.Errorf("claimer triggered %d times, want 1", got)
	}
	// Only POST triggers: a crawler's GET must not.
	if code, _ := do(t, http.MethodGet, s.base+"/trigger"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /trigger = %d, want 405", code)
	}
	if got := s.claimer.triggers.Load(); got != 1 {
		t.Errorf("claimer triggered %d times after a GET, want still 1", got)
	}
}

// poll waits until cond holds, checking every 10ms, or fails the test.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, waitTimeout)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

// startSampler starts a sampler on spec; with an hourly spec the only
// sample is the one Start takes at once.
func startSampler(t *testing.T, store ops.StatsSource, spec string, m *metrics.Metrics) {
	t.Helper()
	s, err := ops.NewSampler(store, time.Minute, spec, nil, m, discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("sampler Stop: %v", err)
		}
	})
}

func TestSamplerSetsGauges(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: mongo.Stats{
		Counts:    map[events.Status]int64{events.StatusNew: 7, events.StatusProcessing: 2, events.StatusPublished: 40, events.StatusFailed: 1},
		OldestNew: time.Now().Add(-30 * time.Second),
		Stale:     2,
	}}
	startSampler(t, store, "@every 1h", m)

	// The sampler sets the gauges one after the other: wait for all.
	want := map[string]float64{"NEW": 7, "PROCESSING": 2, "PUBLISHED": 40, "FAILED": 1, "oldest_new_age_over_30s": 1, "stale": 2}
	var got map[string]float64
	deadline := time.Now().Add(waitTimeout)
	for {
		got = map[string]float64{}
		for _, status := range []string{"NEW", "PROCESSING", "PUBLISHED", "FAILED"} {
			got[status] = testutil.ToFloat64(m.Events.WithLabelValues(status))
		}
		if age := testutil.ToFloat64(m.OldestNewAge); age >= 30 && age < 40 {
			got["oldest_new_age_over_30s"] = 1
		}
		got["stale"] = testutil.ToFloat64(m.StaleProcessing)
		if cmp.Equal(want, got) || time.Now().After(deadline) {
			break
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("gauges %s after Start (-want +got):\n%s", waitTimeout, diff)
	}
	if d := time.Since(store.lastStaleBefore()) - time.Minute; d < -5*time.Second || d > 5*time.Second {
		t.Errorf("Stats asked with staleBefore %s, want about now - 1m", store.lastStaleBefore())
	}
}

func TestStatusHeldAggregates(t *testing.T) {
	t.Parallel()
	var store *fakeStore
	s := startServer(t, func(cfg *ops.ServerConfig) {
		store = cfg.Store.(*fakeStore)
		cfg.Held, cfg.FailedHolds = store, true
	})
	store.mu.Lock()
	store.held = mongo.HeldStats{Aggregates: 3, OldestWaiting: time.Now().Add(-10 * time.Minute)}
	store.mu.Unlock()
	code, body := getJSON(t, s.base+"/status")
	if code != http.StatusOK {
		t.Fatalf("GET /status = %d", code)
	}
	if body["heldAggregates"] != 3.0 {
		t.Errorf("heldAggregates = %v, want 3", body["heldAggregates"])
	}
	if age, _ := body["oldestHeldAgeSeconds"].(float64); age < 600 || age > 610 {
		t.Errorf("oldestHeldAgeSeconds = %v, want about 600", body["oldestHeldAgeSeconds"])
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if !store.failedHolds {
		t.Error("Held asked without failedHolds, want the configured policy")
	}
}

func TestSamplerSetsHeldGauges(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: mongo.Stats{Counts: map[events.Status]int64{}},
		held: mongo.HeldStats{Aggregates: 2, OldestWaiting: time.Now().Add(-time.Hour)}}
	s, err := ops.NewSampler(store, time.Minute, "@every 1h", nil, m, discard)
	if err != nil {
		t.Fatal(err)
	}
	s.TrackHeld(store, true)
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	poll(t, "held gauges set", func() bool {
		age := testutil.ToFloat64(m.OldestHeldAge)
		return testutil.ToFloat64(m.HeldAggregates) == 2 && age >= 3600 && age < 3610
	})
}

func TestSamplerCountsFailure(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	store := &fakeStore{stats: mongo.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}}}
	startSampler(t, store, "@every 10ms", m)
	poll(t, "a good sample sets the NEW gauge", func() bool {
		return testutil.ToFloat64(m.Events.WithLabelValues("NEW")) == 7
	})
	store.setStats(mongo.Stats{}, errors.New("server selection timeout"))
	poll(t, "a failed sample counts as a sampler job error", func() bool {
		return testutil.ToFloat64(m.JobErrors.WithLabelValues("sampler")) >= 1
	})
	if got := testutil.ToFloat64(m.Events.WithLabelValues("NEW")); got != 7 {
		t.Errorf("NEW gauge after a failed sample = %v, want 7: a failure must leave the last good sample", got)
	}
}

// claimStore is a claim.Store that hands out one batch, then nothing, and
// counts the events whose outcome it was told.
type claimStore struct {
	mu      sync.Mutex
	batch   []events.Claimed
	settled int
}

func (s *claimStore) Claim(context.Context, events.Lease, events.ClaimLimit) (events.ClaimResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.batch
	s.batch = nil
	return events.ClaimResult{Claimed: b}, nil
}

func (s *claimStore) MarkPublished(_ context.Context, _ events.Lease, ids []any, _ time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled += len(ids)
	return len(ids), nil
}

func (s *claimStore) Release(_ context.Context, _ events.Lease, r events.Release) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled += len(r.IDs)
	return len(r.IDs), nil
}

// Abandon has nothing to release: this store's claims never fail.
func (s *claimStore) Abandon(context.Context, events.Lease) (int, error) { return 0, nil }

func (s *claimStore) settledCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled
}

// outcomePublisher fails each message as its id says.
type outcomePublisher struct{}

func (outcomePublisher) Ready() error { return nil }

func (outcomePublisher) Publish(_ context.Context, msgs []events.Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		switch {
		case strings.Contains(m.ID, "returned"):
			errs[i] = events.ErrReturned
		case strings.Contains(m.ID, "nacked"):
			errs[i] = events.ErrNacked
		case strings.Contains(m.ID, "outage"):
			errs[i] = events.ErrUnavailable
		case strings.Contains(m.ID, "last"):
			errs[i] = events.ErrReturned // on its last attempt: FAILED
		}
	}
	return errs
}

// TestMetricsEndpoint runs a claim with every kind of outcome and a sample
// into a registry, then scrapes /metrics: every outbox_ metric is there,
// and labels take only their fixed sets of values, never an event id or
// type.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	m := metrics.New(s.registry)

	const secretType = "tenant-7f3a.order.created"
	var batch []events.Claimed
	for _, id := range []string{"evt-ok-91c2", "evt-returned-5d1e", "evt-nacked-aa07", "evt-outage-0b3c", "evt-last-77f0", "evt-poison-e4d9"} {
		doc := bson.D{
			{Key: "_id", Value: id},
			{Key: "type", Value: secretType},
			{Key: "aggregateId", Value: id + "-aggregate"},
			{Key: "payload", Value: bson.D{{Key: "id", Value: id}}},
			{Key: "createdAt", Value: time.Now()},
		}
		if strings.Contains(id, "poison") {
			doc = doc[:len(doc)-2] // no payload, no createdAt
		}
		raw, err := bson.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		attempts := 1
		if strings.Contains(id, "last") {
			attempts = 3
		}
		batch = append(batch, events.Claimed{ID: id, Attempts: attempts, Doc: raw})
	}
	store := &claimStore{batch: batch}
	c, err := claim.New(store, outcomePublisher{}, claim.Config{
		WorkerID: "host-a-42", Schedule: "@every 1h", MaxAttempts: 3, Logger: discard, Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = c.Stop(ctx)
	})
	c.Trigger()
	poll(t, "the claimer settles its batch and counts every outcome", func() bool {
		return store.settledCount() == len(batch) &&
			testutil.ToFloat64(m.Published) == 1 &&
			testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonInvalid)) == 1 &&
			testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonMaxAttempts)) == 1 &&
			testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonReturned)) == 1 &&
			testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonNacked)) == 1 &&
			testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonBrokerUnavailable)) == 1
	})
	startSampler(t, &fakeStore{stats: mongo.Stats{Counts: map[events.Status]int64{events.StatusNew: 1}}}, "@every 1h", m)
	poll(t, "the sampler samples", func() bool { return testutil.ToFloat64(m.Events.WithLabelValues("NEW")) == 1 })
	m.BrokerConnected.Set(1)
	m.JobErrors.WithLabelValues("recovery").Inc()
	m.DBCommands.WithLabelValues("find").Inc()

	code, text := do(t, http.MethodGet, s.base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d, want 200", code)
	}
	for _, name := range []string{
		"outbox_events_claimed_total", "outbox_events_published_total", "outbox_events_failed_total",
		"outbox_events_released_total", "outbox_events_recovered_total", "outbox_events_deleted_total",
		"outbox_claims_lost_total", "outbox_publish_latency_seconds", "outbox_claim_batch_size",
		"outbox_events", "outbox_oldest_new_event_age_seconds", "outbox_stale_processing_events",
		"outbox_broker_connected", "outbox_job_errors_total", "outbox_db_commands_total",
	} {
		if !strings.Contains(string(text), "\n# TYPE "+name+" ") {
			t.Errorf("/metrics has no metric %s", name)
		}
	}
	for _, line := range []string{
		`outbox_events_claimed_total 6`,
		`outbox_events_published_total 1`,
		`outbox_events_failed_total{reason="invalid"} 1`,
		`outbox_events_failed_total{reason="max_attempts"} 1`,
		`outbox_events_released_total{reason="returned"} 1`,
		`outbox_events_released_total{reason="nacked"} 1`,
		`outbox_events_released_total{reason="broker_unavailable"} 1`,
	} {
		if !strings.Contains(string(text), "\n"+line+"\n") {
			t.Errorf("/metrics has no line %q", line)
		}
	}
	for _, c := range batch {
		for _, secret := range []string{c.ID.(string), "7f3a"} {
			if strings.Contains(string(text), secret) {
				t.Errorf("/metrics contains %q, part of an event id or type", secret)
			}
		}
	}

	// Every label of every outbox_ series is one of a few names, each
	// with a fixed set of values.
	allowed := map[string][]string{
		"status": {"NEW", "PROCESSING", "PUBLISHED", "FAILED"},
		"reason": {metrics.ReasonInvalid, metrics.ReasonMaxAttempts, metrics.ReasonStaleMaxAttempts, metrics.ReasonNacked,
			metrics.ReasonReturned, metrics.ReasonUnconfirmed, metrics.ReasonBrokerUnavailable, metrics.ReasonError},
		"job": {"claim", "recovery", "retention", "sampler"},
		"command": {"find", "getMore", "update", "delete", "insert", "aggregate", "count", "commitTransaction",
			"abortTransaction", "createIndexes", "ping", "hello", "endSessions", "killCursors", "other"},
	}
	families, err := s.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "outbox_") {
			t.Errorf("metric %s has no outbox_ prefix", f.GetName())
		}
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				values, ok := allowed[l.GetName()]
				switch {
				case !ok:
					t.Errorf("%s has label %s=%q, not one of the fixed label names", f.GetName(), l.GetName(), l.GetValue())
				case values != nil && !slices.Contains(values, l.GetValue()):
					t.Errorf("%s has label %s=%q, not one of its fixed values %v", f.GetName(), l.GetName(), l.GetValue(), values)
				}
			}
		}
	}
}
