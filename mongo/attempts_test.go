package mongo_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
)

// TestAttemptHistoryKeepsTheLast: every release that records an attempt
// adds it to the event's history, oldest first, and the history keeps the
// last events.AttemptErrorsKept; a release without one adds nothing.
func TestAttemptHistoryKeepsTheLast(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	insert(t, coll, ev("e1", events.StatusNew, ago(time.Minute)), ev("e2", events.StatusNew, ago(time.Second)))
	const releases = events.AttemptErrorsKept + 3
	var want []events.AttemptError
	for i := range releases {
		l := events.Lease{WorkerID: "w", Token: fmt.Sprint("t", i), At: base.Add(time.Duration(i) * time.Second)}
		if got, _, err := claimN(t.Context(), s, l, 2); err != nil || len(got) != 2 {
			t.Fatalf("claim %d = %v, %v; want both events", i, ids(got), err)
		}
		a := events.AttemptError{At: l.At, WorkerID: "w", Reason: metrics.ReasonNacked, Error: fmt.Sprint("nack ", i)}
		r := events.Release{IDs: []any{"e1", "e2"}, Status: events.StatusNew, LastError: a.Error, Attempt: &a}
		if i == 1 {
			// A refund records nothing.
			r.Attempt, r.Refund = nil, true
		} else {
			want = append(want, a)
		}
		if n, err := s.Release(t.Context(), l, r); err != nil || n != 2 {
			t.Fatalf("release %d = %d, %v; want 2, nil", i, n, err)
		}
	}
	want = want[len(want)-events.AttemptErrorsKept:]
	for _, id := range []string{"e1", "e2"} {
		if diff := cmp.Diff(want, get(t, coll, id).AttemptErrors); diff != "" {
			t.Errorf("%s: attempt history (-want +got):\n%s", id, diff)
		}
	}
}

// TestAttemptErrorIsBounded: an attempt's error, worker id and reason are
// cut, so that a history fits the room events.ManagedReserveBytes keeps.
func TestAttemptErrorIsBounded(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	l := lease("w")
	claimAll(t, s, coll, l, "e1")
	long := strings.Repeat("é", 4000)
	a := events.AttemptError{At: base, WorkerID: strings.Repeat("w", 1000), Reason: strings.Repeat("r", 100), Error: long}
	if _, err := s.Release(t.Context(), l, events.Release{IDs: []any{"e1"}, Status: events.StatusFailed, LastError: "x", Attempt: &a}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	got := get(t, coll, "e1").AttemptErrors
	if len(got) != 1 {
		t.Fatalf("history has %d entries, want 1", len(got))
	}
	if e := got[0]; len(e.Error) > 512 || !strings.HasSuffix(e.Error, "...") || len(e.WorkerID) > 128 || len(e.Reason) > 32 {
		t.Errorf("entry not bounded: error %d bytes, worker id %d, reason %d", len(e.Error), len(e.WorkerID), len(e.Reason))
	}
}

// TestRecoverStaleRecordsTheStaleWorker: the attempt a stale reset records
// names the worker whose claim went stale, not the one that recovered it.
func TestRecoverStaleRecordsTheStaleWorker(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	claimed := func(id, worker string, attempts int) bson.D {
		d := ev(id, events.StatusProcessing, ago(2*time.Hour),
			field(events.FieldClaimToken, "tok"), field(events.FieldProcessingAt, ago(time.Hour)), field(events.FieldAttempts, attempts))
		if worker != "" {
			d = append(d, field(events.FieldWorkerID, worker))
		}
		return d
	}
	insert(t, coll, claimed("a", "dead-a", 1), claimed("b", "dead-b", 1), claimed("nobody", "", 1), claimed("last", "dead-a", 3))
	if reset, failed, err := s.RecoverStale(t.Context(), ago(time.Minute), base, 3); err != nil || reset != 3 || failed != 1 {
		t.Fatalf("RecoverStale = %d, %d, %v; want 3, 1, nil", reset, failed, err)
	}
	for id, want := range map[string]struct{ worker, reason string }{
		"a": {"dead-a", metrics.ReasonStale}, "b": {"dead-b", metrics.ReasonStale},
		"nobody": {"", metrics.ReasonStale}, "last": {"dead-a", metrics.ReasonStaleMaxAttempts},
	} {
		e := get(t, coll, id)
		if len(e.AttemptErrors) != 1 {
			t.Errorf("%s: %d attempts recorded, want 1", id, len(e.AttemptErrors))
			continue
		}
		got := e.AttemptErrors[0]
		if got.WorkerID != want.worker || got.Reason != want.reason || !got.At.Equal(base) || got.Error != e.LastError {
			t.Errorf("%s: recorded %+v; want worker %q, reason %s, at %s, the lastError %q", id, got, want.worker, want.reason, base, e.LastError)
		}
	}
}

// TestClaimRefusalRecordsAnAttempt: an event a claim refuses is FAILED
// with the refusal in its history, under the claiming worker.
func TestClaimRefusalRecordsAnAttempt(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	insert(t, coll, ev("bad", events.StatusNew, ago(time.Minute), field(events.FieldAttempts, "three")))
	l := lease("w")
	if _, _, err := claimN(t.Context(), s, l, 10); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	// The bad field stays as written, so the event does not decode whole.
	var e struct {
		Status        events.Status         `bson:"status"`
		LastError     string                `bson:"lastError"`
		AttemptErrors []events.AttemptError `bson:"attemptErrors"`
	}
	if err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: "bad"}}).Decode(&e); err != nil {
		t.Fatalf("find the refused event: %v", err)
	}
	want := []events.AttemptError{{At: l.At, WorkerID: "w", Reason: metrics.ReasonInvalid, Error: e.LastError}}
	if e.Status != events.StatusFailed || !cmp.Equal(want, e.AttemptErrors) {
		t.Errorf("refused event: status %s, history %+v; want FAILED with %+v", e.Status, e.AttemptErrors, want)
	}
}
