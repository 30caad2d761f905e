package mongo_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/service"
)

type readyBroker struct{}

func (readyBroker) Ready() error { return nil }

type idleJob struct{}

func (idleJob) LastRun() time.Time  { return time.Time{} }
func (idleJob) Wake() time.Duration { return 0 }
func (idleJob) BatchLimit() int     { return 500 }

// A worker whose clock is an hour off reports the same ages, and takes back
// the same stale claims, as one whose clock is right: every age is
// measured with the database server's clock. The server runs on this
// machine, so its clock is the real one and the events' times are written
// against it here.
func TestAgesUseTheServersClockWhateverTheWorkersSays(t *testing.T) {
	t.Parallel()
	const (
		oldestAge  = 30 * time.Second
		staleAfter = 10 * time.Second
	)
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := testenv.Database(t)
			coll := db.Collection(mongo.CollectionDefault)
			store := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
			clock := mongo.NewClock(db.Client(), slog.New(slog.DiscardHandler))
			mongo.SetLocalClock(clock, func() time.Time { return time.Now().Add(skew) })
			if err := clock.Sync(ctx); err != nil {
				t.Fatal(err)
			}

			now := time.Now().UTC()
			if _, err := coll.InsertMany(ctx, []any{
				bson.D{{Key: events.FieldID, Value: "new"}, {Key: events.FieldType, Value: "t"},
					{Key: events.FieldStatus, Value: events.StatusNew}, {Key: events.FieldCreatedAt, Value: now.Add(-oldestAge)}},
				// Claimed a second ago: fresh, whatever the worker's clock says.
				bson.D{{Key: events.FieldID, Value: "fresh"}, {Key: events.FieldType, Value: "t"},
					{Key: events.FieldStatus, Value: events.StatusProcessing}, {Key: events.FieldCreatedAt, Value: now.Add(-time.Minute)},
					{Key: events.FieldProcessingAt, Value: now.Add(-time.Second)}, {Key: events.FieldAttempts, Value: 1}},
				// Claimed 20 s ago: stale.
				bson.D{{Key: events.FieldID, Value: "stale"}, {Key: events.FieldType, Value: "t"},
					{Key: events.FieldStatus, Value: events.StatusProcessing}, {Key: events.FieldCreatedAt, Value: now.Add(-time.Minute)},
					{Key: events.FieldProcessingAt, Value: now.Add(-2 * staleAfter)}, {Key: events.FieldAttempts, Value: 1}},
			}); err != nil {
				t.Fatal(err)
			}
			// The oldest age may read a little more than oldestAge: the
			// test's own time passes.
			ageRight := func(age time.Duration) bool { return age >= oldestAge-time.Second && age < oldestAge+10*time.Second }

			// worker stats and /status: Stats at the clock's now.
			st, err := store.Stats(ctx, clock.Now().Add(-staleAfter))
			if err != nil {
				t.Fatal(err)
			}
			if age := st.OldestNewAge(clock.Now()); !ageRight(age) {
				t.Errorf("OldestNewAge = %s, want about %s", age, oldestAge)
			}
			if st.Stale != 1 {
				t.Errorf("stale count = %d, want 1 (only the claim 20 s old)", st.Stale)
			}

			// The sampler's gauges.
			m := metrics.New(nil)
			sampler, err := ops.NewSampler(ops.SamplerConfig{
				Store: store, StaleAfter: staleAfter, Schedule: "@every 1h", Archetype: service.Archetype{Now: clock.Now, Metrics: m, Logger: slog.New(slog.DiscardHandler)},
			})
			if err != nil {
				t.Fatal(err)
			}
			testenv.Start(t, sampler)
			waitUntil(t, "the sampler's first sample", func() bool { v, ok := testenv.Value(m.StaleProcessing); return ok && v == 1 })
			waitUntil(t, "the oldest-age gauge", func() bool { v, _ := testenv.Value(m.OldestNewAge); return v > 0 })
			if age := time.Duration(testutil.ToFloat64(m.OldestNewAge) * float64(time.Second)); !ageRight(age) {
				t.Errorf("outbox_oldest_new_event_age_seconds = %s, want about %s", age, oldestAge)
			}

			// /status.
			srv, err := ops.NewServer(ops.ServerConfig{
				Addr: "127.0.0.1:0", Gatherer: prometheus.NewRegistry(),
				Outboxes: []ops.Outbox{{Name: "default", Store: store, Broker: readyBroker{}, Samples: sampler,
					Claimer: idleJob{}, Recovery: idleJob{}}},
				Archetype: service.Archetype{Logger: slog.New(slog.DiscardHandler), Now: clock.Now},
			})
			if err != nil {
				t.Fatal(err)
			}
			testenv.Start(t, srv)
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+srv.Addr()+"/status", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				OldestNewAgeSeconds float64 `json:"oldestNewAgeSeconds"`
				StaleProcessing     int64   `json:"staleProcessing"`
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			_ = resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if age := time.Duration(body.OldestNewAgeSeconds * float64(time.Second)); !ageRight(age) || body.StaleProcessing != 1 {
				t.Errorf("/status: oldest age %s, stale %d; want about %s and 1", age, body.StaleProcessing, oldestAge)
			}

			// Recovery takes back the stale claim and only it.
			rec, err := recovery.New(store, recovery.Config{
				Schedule: "@every 1h", StaleAfter: staleAfter, Archetype: service.Archetype{Now: clock.Now, Logger: slog.New(slog.DiscardHandler)},
			})
			if err != nil {
				t.Fatal(err)
			}
			testenv.Start(t, rec)
			rec.Trigger()
			waitUntil(t, "recovery's run", func() bool { return !rec.LastRun().IsZero() })
			for id, want := range map[string]events.Status{"fresh": events.StatusProcessing, "stale": events.StatusNew} {
				var doc struct {
					Status events.Status `bson:"status"`
				}
				if err := coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: id}}).Decode(&doc); err != nil {
					t.Fatal(err)
				}
				if doc.Status != want {
					t.Errorf("%s claim after recovery: %s, want %s", id, doc.Status, want)
				}
			}
		})
	}
}

// waitUntil waits for cond, failing the test with what.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, testenv.WaitTimeout, func() (bool, string) { return cond(), what })
}
