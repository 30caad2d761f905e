package ops_test

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/ops"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	now := time.Now().UTC()
	lastClaim := now.Add(-2 * time.Second).Truncate(time.Millisecond)
	s.claimer.last.Store(lastClaim.UnixNano())
	// The recovery job has not run yet: lastRecoveryAt is null.
	stats := events.Stats{
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

	s.store.setStats(events.Stats{}, errors.New("count NEW events: timeout"))
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

func TestStatusHeldAggregates(t *testing.T) {
	t.Parallel()
	var store *fakeStore
	s := startServer(t, func(cfg *ops.ServerConfig) {
		store = cfg.Store.(*fakeStore)
		cfg.Held, cfg.FailedHolds = store, true
	})
	store.mu.Lock()
	store.held = events.HeldStats{Aggregates: 3, OldestWaiting: time.Now().Add(-10 * time.Minute)}
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
