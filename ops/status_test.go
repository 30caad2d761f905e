package ops_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/ops"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	now := time.Now().UTC()
	lastClaim := now.Add(-2 * time.Second).Truncate(time.Millisecond)
	s.claimer.last.Store(lastClaim.UnixNano())
	// The recovery job has not run yet: lastRecoveryAt is null.

	// Before the first sample there is nothing to show.
	code, body := getJSON(t, s.base+"/status")
	if code != http.StatusServiceUnavailable || body["error"] == nil || body["workerId"] != "host-a-42" || body["lastClaimAt"] == nil {
		t.Errorf("GET /status before the first sample = %d %v, want 503 with an error and the worker's own state", code, body)
	}

	sampledAt := now.Add(-5 * time.Second).Truncate(time.Millisecond)
	s.samples.set(&ops.Sample{At: sampledAt, Stats: events.Stats{
		// No PROCESSING entry: the body still lists it, as 0.
		Counts:    map[events.Status]int64{events.StatusNew: 5, events.StatusPublished: 10, events.StatusFailed: 1, events.StatusUnknown: 2},
		OldestNew: sampledAt.Add(-90 * time.Second),
		Stale:     3,
	}})
	code, body = getJSON(t, s.base+"/status")
	if code != http.StatusOK {
		t.Fatalf("GET /status = %d, want 200 (body %v)", code, body)
	}
	wantKeys := []string{"batchLimit", "build", "counts", "heldAggregates", "lastClaimAt", "lastRecoveryAt", "oldestHeldAgeSeconds", "oldestNewAgeSeconds", "outbox", "pausedTypes",
		"sampleAgeSeconds", "sampledAt", "staleProcessing", "workerId"}
	if diff := cmp.Diff(wantKeys, slices.Sorted(maps.Keys(body))); diff != "" {
		t.Errorf("GET /status fields (-want +got):\n%s", diff)
	}
	wantCounts := map[string]any{"NEW": 5.0, "PROCESSING": 0.0, "PUBLISHED": 10.0, "FAILED": 1.0, "unknown": 2.0}
	if diff := cmp.Diff(wantCounts, body["counts"]); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if body["workerId"] != "host-a-42" {
		t.Errorf("workerId = %v, want host-a-42", body["workerId"])
	}
	// Ages are as of the sample: the oldest NEW event was 90 s old then.
	if body["oldestNewAgeSeconds"] != 90.0 {
		t.Errorf("oldestNewAgeSeconds = %v, want 90 (as of the sample)", body["oldestNewAgeSeconds"])
	}
	if got, _ := body["sampledAt"].(string); got != sampledAt.Format(time.RFC3339Nano) {
		t.Errorf("sampledAt = %v, want %s", body["sampledAt"], sampledAt.Format(time.RFC3339Nano))
	}
	if age, _ := body["sampleAgeSeconds"].(float64); age < 5 || age > 15 {
		t.Errorf("sampleAgeSeconds = %v, want about 5", body["sampleAgeSeconds"])
	}
	if body["batchLimit"] != 250.0 {
		t.Errorf("batchLimit = %v, want the claimer's 250", body["batchLimit"])
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
	if at := s.store.lastStaleBefore(); !at.IsZero() {
		t.Errorf("/status queried the store (Stats with staleBefore %s), want it to answer from the sample", at)
	}
}

func TestTrigger(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if code, _ := do(t, http.MethodPost, s.base+"/trigger"); code != http.StatusAccepted {
		t.Errorf("POST /trigger = %d, want 202", code)
	}
	s.claimer.wantTriggered(t, 1, "after a POST")
	// Only POST triggers: a crawler's GET must not.
	if code, _ := do(t, http.MethodGet, s.base+"/trigger"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /trigger = %d, want 405", code)
	}
	s.claimer.wantTriggered(t, 1, "after a GET")
}

// TestTriggerDuringBackoff: while claims back off after failed runs, a
// trigger runs nothing early and says how long the backoff has left.
func TestTriggerDuringBackoff(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	s.claimer.backoff.Store(int64(4 * time.Second))
	code, body := do(t, http.MethodPost, s.base+"/trigger")
	if code != http.StatusAccepted {
		t.Errorf("POST /trigger during a backoff = %d, want 202", code)
	}
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("POST /trigger: %v\n%s", err, body)
	}
	if got["triggered"] != false || got["backoffSeconds"] != 4.0 {
		t.Errorf("POST /trigger during a backoff = %s, want triggered false and backoffSeconds 4", body)
	}
	s.claimer.wantTriggered(t, 0, "during its backoff")
}

func TestStatusHeldAggregates(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	at := time.Now().UTC()
	s.samples.set(&ops.Sample{At: at, Stats: events.Stats{Counts: map[events.Status]int64{}},
		Held: &events.HeldStats{Aggregates: 3, OldestWaiting: at.Add(-10 * time.Minute), Capped: true}})
	code, body := getJSON(t, s.base+"/status")
	if code != http.StatusOK {
		t.Fatalf("GET /status = %d", code)
	}
	if body["heldAggregates"] != 3.0 || body["heldCapped"] != true {
		t.Errorf("heldAggregates = %v, heldCapped = %v; want 3 and true", body["heldAggregates"], body["heldCapped"])
	}
	if body["oldestHeldAgeSeconds"] != 600.0 {
		t.Errorf("oldestHeldAgeSeconds = %v, want 600 (as of the sample)", body["oldestHeldAgeSeconds"])
	}
	if paused, ok := body["pausedTypes"].([]any); !ok || len(paused) != 0 {
		t.Errorf("pausedTypes = %#v, want [] when none is paused", body["pausedTypes"])
	}
}

// TestStatusPausedTypes: /status lists the paused types of the sample.
func TestStatusPausedTypes(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	at := time.Now().UTC().Truncate(time.Millisecond)
	s.samples.set(&ops.Sample{At: at, Stats: events.Stats{Counts: map[events.Status]int64{}},
		Paused: []events.Pause{{Type: "order.paid", By: "ana", Reason: "billing is down", At: at}}})
	code, body := getJSON(t, s.base+"/status")
	if code != http.StatusOK {
		t.Fatalf("GET /status = %d", code)
	}
	want := []any{map[string]any{"type": "order.paid", "by": "ana", "reason": "billing is down", "at": at.Format(time.RFC3339Nano)}}
	if diff := cmp.Diff(want, body["pausedTypes"]); diff != "" {
		t.Errorf("pausedTypes (-want +got):\n%s", diff)
	}
}

// TestStatusSendsNoQuery, on a real store: the sampler's commands carry a
// server-side time limit within its own timeout, and /status answers from
// its sample without sending any command, however often it is read.
func TestStatusSendsNoQuery(t *testing.T) {
	t.Parallel()
	store, rec := mongotest.RecordingStore(t)
	mongotest.Insert(t, store.Collection(),
		mongotest.Event("n1", events.StatusNew, time.Now().Add(-time.Minute).Truncate(time.Millisecond),
			bson.E{Key: events.FieldAggregateType, Value: "order"}, bson.E{Key: events.FieldAggregateID, Value: "a"}),
		mongotest.Event("n0", events.StatusNew, time.Now().Add(-2*time.Minute).Truncate(time.Millisecond),
			bson.E{Key: events.FieldAggregateType, Value: "order"}, bson.E{Key: events.FieldAggregateID, Value: "a"},
			bson.E{Key: events.FieldRetryAt, Value: time.Now().Add(time.Hour)}))
	rec.Take()
	sampler := startSampler(t, ops.SamplerConfig{Store: store, Held: store, Schedule: "@every 1h"})
	eventually(t, "the first sample", func() bool { _, ok := sampler.Latest(); return ok })

	const sampleTimeout = 10 * time.Second // the sampler's, which the limits derive from
	for _, sent := range rec.Take() {
		switch sent.Name {
		case "getMore", "killCursors", "endSessions":
			continue
		}
		v, err := sent.Command.LookupErr("maxTimeMS")
		ms, ok := v.AsInt64OK()
		if err != nil || !ok || ms <= 0 || ms > sampleTimeout.Milliseconds() {
			t.Errorf("the sampler sent %s with maxTimeMS %v, want 1 to %d ms", sent.Name, v, sampleTimeout.Milliseconds())
		}
	}

	s := startServer(t, func(cfg *ops.ServerConfig) { cfg.Outboxes[0].Samples = sampler })
	for range 10 {
		code, body := getJSON(t, s.base+"/status")
		if code != http.StatusOK {
			t.Fatalf("GET /status = %d %v", code, body)
		}
		if counts, _ := body["counts"].(map[string]any); counts["NEW"] != 2.0 || body["heldAggregates"] != 1.0 {
			t.Fatalf("GET /status = %v, want 2 NEW events and 1 held aggregate", body)
		}
	}
	if sent := rec.Take(); len(sent) != 0 {
		names := make([]string, len(sent))
		for i, c := range sent {
			names[i] = c.Name
		}
		t.Errorf("10 GET /status sent %d commands (%v), want none", len(sent), names)
	}
}
