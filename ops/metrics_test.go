package ops_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/service"
)

// claimStore is a claim.Store that hands out one batch, then nothing, and
// counts the events whose outcome it was told.
type claimStore struct {
	mu      sync.Mutex
	batch   []events.Claimed
	settled int
}

func (s *claimStore) ReadClaimable(context.Context, time.Time, events.ClaimLimit) ([]bson.Raw, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	docs := make([]bson.Raw, len(s.batch))
	for i, c := range s.batch {
		docs[i] = c.Doc
	}
	return docs, false, nil
}

func (s *claimStore) ClaimRead(context.Context, events.Lease, []bson.Raw, events.ClaimLimit) (events.ClaimResult, error) {
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
		raw := testenv.Marshal(t, doc)
		attempts := 1
		if strings.Contains(id, "last") {
			attempts = 3
		}
		batch = append(batch, events.Claimed{ID: id, Attempts: attempts, Doc: raw})
	}
	store := &claimStore{batch: batch}
	c, err := claim.New(store, outcomePublisher{}, claim.Config{
		WorkerID: "host-a-42", Schedule: "@every 1h", MaxAttempts: 3, Archetype: service.Archetype{Logger: discard, Metrics: m},
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, c)
	c.Trigger()
	eventually(t, "the claimer settles its batch and counts every outcome", func() bool {
		return store.settledCount() == len(batch) &&
			testutil.ToFloat64(m.Published) == 1 &&
			testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonInvalid)) == 1 &&
			testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonMaxAttempts)) == 1 &&
			testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonReturned)) == 1 &&
			testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonNacked)) == 1 &&
			testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonBrokerUnavailable)) == 1
	})
	sampler := startSampler(t, ops.SamplerConfig{
		Store: &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 1}}}, Schedule: "@every 1h", Archetype: service.Archetype{Metrics: m},
	})
	// Not the NEW gauge alone: the sample's other gauges are set after it.
	eventually(t, "the sampler samples", func() bool { _, ok := sampler.Latest(); return ok })
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
		"outbox_partitions_owned", "outbox_claim_runs_total",
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
		"status": {"NEW", "PROCESSING", "PUBLISHED", "FAILED", "unknown"},
		"reason": {metrics.ReasonInvalid, metrics.ReasonRejected, metrics.ReasonMaxAttempts, metrics.ReasonStaleMaxAttempts,
			metrics.ReasonTimeout, metrics.ReasonNacked, metrics.ReasonReturned, metrics.ReasonUnconfirmed,
			metrics.ReasonBrokerUnavailable, metrics.ReasonError, metrics.ReasonHeldBack},
		"job":    metrics.Jobs,
		"result": metrics.ClaimOutcomes,
		"kind":   metrics.SequenceKinds,
		// outbox_build_info: one series, this binary's build.
		"version": {buildinfo.Read().Version}, "revision": {buildinfo.Read().Revision}, "build_date": {buildinfo.Read().BuildDate},
		"goversion": {buildinfo.Read().GoVersion}, "goos": {buildinfo.Read().GOOS}, "goarch": {buildinfo.Read().GOARCH},
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
