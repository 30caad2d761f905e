package mongo_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

func TestRecoverStale(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	claimedBy := func(at time.Time, attempts int) []bson.E {
		return []bson.E{
			field(events.FieldWorkerID, "dead-worker"), field(events.FieldClaimToken, "tok"),
			field(events.FieldProcessingAt, at), field(events.FieldAttempts, attempts),
		}
	}
	staleBefore := ago(time.Minute)
	insert(t, coll,
		ev("stale", events.StatusProcessing, ago(time.Hour), claimedBy(ago(2*time.Minute), 1)...),
		ev("stale-last", events.StatusProcessing, ago(time.Hour), claimedBy(ago(2*time.Minute), 3)...),
		ev("stale-over", events.StatusProcessing, ago(time.Hour), claimedBy(ago(2*time.Minute), 4)...),
		ev("fresh", events.StatusProcessing, ago(time.Hour), claimedBy(ago(59*time.Second), 3)...),
		// PUBLISHED keeps its old processingAt: recovery must leave it be.
		ev("published", events.StatusPublished, ago(time.Hour),
			append(claimedBy(ago(time.Hour), 1), field(events.FieldPublishedAt, ago(time.Hour)))...),
		ev("new", events.StatusNew, ago(time.Hour)),
	)

	reset, failed, err := s.RecoverStale(t.Context(), staleBefore, base, 3)
	if err != nil {
		t.Fatalf("RecoverStale: %v", err)
	}
	if reset != 1 || failed != 2 {
		t.Errorf("RecoverStale = reset %d, failed %d; want 1, 2", reset, failed)
	}

	e := get(t, coll, "stale")
	if e.Status != events.StatusNew || e.Attempts != 1 || !strings.Contains(e.LastError, "stale") {
		t.Errorf("stale: status %s attempts %d lastError %q; want NEW, 1, a reason saying stale", e.Status, e.Attempts, e.LastError)
	}
	for _, f := range []string{events.FieldWorkerID, events.FieldProcessingAt, events.FieldClaimToken} {
		if has(t, coll, "stale", f) {
			t.Errorf("stale: %s still set after the reset", f)
		}
	}
	for _, id := range []string{"stale-last", "stale-over"} {
		e := get(t, coll, id)
		if e.Status != events.StatusFailed || !e.FailedAt.Equal(base) || !strings.Contains(e.LastError, "last attempt") {
			t.Errorf("%s: status %s failedAt %s lastError %q; want FAILED at %s with a reason", id, e.Status, e.FailedAt, e.LastError, base)
		}
		if has(t, coll, id, events.FieldClaimToken) {
			t.Errorf("%s: claimToken still set: the dead worker's late write could still land", id)
		}
	}
	if diff := cmp.Diff(map[string]events.Status{
		"stale": events.StatusNew, "stale-last": events.StatusFailed, "stale-over": events.StatusFailed,
		"fresh": events.StatusProcessing, "published": events.StatusPublished, "new": events.StatusNew,
	}, statuses(t, coll)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if e := get(t, coll, "fresh"); e.WorkerID != "dead-worker" || e.ClaimToken != "tok" {
		t.Errorf("fresh claim changed: %+v", e)
	}

	// Nothing stale is left; a second run (another replica) changes nothing.
	if reset, failed, err := s.RecoverStale(t.Context(), staleBefore, base, 3); err != nil || reset != 0 || failed != 0 {
		t.Errorf("second RecoverStale = %d, %d, %v; want 0, 0, nil", reset, failed, err)
	}
	// maxAttempts 0 means no limit: the fresh one, once stale, goes back to
	// NEW whatever its attempts.
	if reset, failed, err := s.RecoverStale(t.Context(), base, base, 0); err != nil || reset != 1 || failed != 0 {
		t.Errorf("RecoverStale without a limit = %d, %d, %v; want 1, 0, nil", reset, failed, err)
	}
	if e := get(t, coll, "fresh"); e.Status != events.StatusNew {
		t.Errorf("fresh after it went stale with no limit: %s, want NEW", e.Status)
	}
}

// TestRecoverStaleUnusableProcessingAt: a PROCESSING event whose
// processingAt cannot go stale (missing, null, not a date, or later than
// now by more than the stale threshold) is reset to NEW, whatever its
// attempts; one a little ahead (clock skew) or fresh is left to the
// stale test.
func TestRecoverStaleUnusableProcessingAt(t *testing.T) {
	t.Parallel()
	const staleAfter = time.Minute
	tests := []struct {
		name         string
		processingAt any // unsetProcessingAt: no field
		attempts     int
		want         events.Status
	}{
		{"missing", unsetProcessingAt, 1, events.StatusNew},
		{"null", nil, 1, events.StatusNew},
		{"string", "2025-03-04T12:00:00Z", 1, events.StatusNew},
		{"number", int64(1741089600000), 1, events.StatusNew},
		{"far future", base.Add(2 * staleAfter), 1, events.StatusNew},
		{"far future, out of attempts", base.Add(time.Hour), 3, events.StatusNew},
		{"missing, out of attempts", unsetProcessingAt, 5, events.StatusNew},
		{"a little ahead", base.Add(staleAfter / 2), 1, events.StatusProcessing},
		{"just at the margin", base.Add(staleAfter), 1, events.StatusProcessing},
		{"fresh", ago(time.Second), 1, events.StatusProcessing},
		{"stale", ago(2 * staleAfter), 1, events.StatusNew},
	}
	s, coll := setup(t)
	var docs []bson.D
	for _, tt := range tests {
		d := ev(tt.name, events.StatusProcessing, ago(time.Hour),
			field(events.FieldWorkerID, "w"), field(events.FieldClaimToken, "tok"), field(events.FieldAttempts, tt.attempts))
		if tt.processingAt != unsetProcessingAt {
			d = append(d, field(events.FieldProcessingAt, tt.processingAt))
		}
		docs = append(docs, d)
	}
	insert(t, coll, docs...)

	reset, failed, err := s.RecoverStale(t.Context(), base.Add(-staleAfter), base, 3)
	if err != nil {
		t.Fatalf("RecoverStale: %v", err)
	}
	wantReset := 0
	for _, tt := range tests {
		if tt.want == events.StatusNew {
			wantReset++
		}
	}
	if reset != wantReset || failed != 0 {
		t.Errorf("RecoverStale = reset %d, failed %d; want %d, 0", reset, failed, wantReset)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := get(t, coll, tt.name)
			if e.Status != tt.want {
				t.Fatalf("status %s, want %s", e.Status, tt.want)
			}
			if tt.want != events.StatusNew {
				return
			}
			for _, f := range []string{events.FieldWorkerID, events.FieldProcessingAt, events.FieldClaimToken} {
				if has(t, coll, tt.name, f) {
					t.Errorf("%s still set after the reset", f)
				}
			}
			if tt.name != "stale" && !strings.Contains(e.LastError, "processingAt") {
				t.Errorf("lastError %q does not name processingAt", e.LastError)
			}
		})
	}
}

// unsetProcessingAt, as a processingAt above, leaves the field out.
const unsetProcessingAt = "\x00unset"

func TestDeletePublished(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	cutoff := ago(24 * time.Hour)
	var docs []bson.D
	for i := range 5 {
		docs = append(docs, ev(fmt.Sprintf("old-%d", i), events.StatusPublished, ago(48*time.Hour),
			field(events.FieldPublishedAt, cutoff.Add(-time.Duration(i+1)*time.Minute))))
	}
	docs = append(docs,
		ev("at-cutoff", events.StatusPublished, ago(48*time.Hour), field(events.FieldPublishedAt, cutoff)),
		ev("recent", events.StatusPublished, ago(48*time.Hour), field(events.FieldPublishedAt, ago(time.Hour))),
		// FAILED is never deleted, even one that somehow carries an old publishedAt.
		ev("failed", events.StatusFailed, ago(48*time.Hour),
			field(events.FieldFailedAt, ago(47*time.Hour)), field(events.FieldPublishedAt, ago(47*time.Hour))),
		ev("new", events.StatusNew, ago(48*time.Hour)),
		ev("processing", events.StatusProcessing, ago(48*time.Hour), field(events.FieldProcessingAt, ago(47*time.Hour))),
	)
	insert(t, coll, docs...)

	var got []int
	for range 3 {
		n, err := s.DeletePublished(t.Context(), cutoff, 3)
		if err != nil {
			t.Fatalf("DeletePublished: %v", err)
		}
		got = append(got, n)
	}
	if diff := cmp.Diff([]int{3, 2, 0}, got); diff != "" {
		t.Errorf("deleted per call with limit 3 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]events.Status{
		"at-cutoff": events.StatusPublished, "recent": events.StatusPublished, "failed": events.StatusFailed,
		"new": events.StatusNew, "processing": events.StatusProcessing,
	}, statuses(t, coll)); diff != "" {
		t.Errorf("events left (-want +got):\n%s", diff)
	}
}
