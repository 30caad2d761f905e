package mongo_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/events"
)

func TestMarkPublished(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	a := lease("a")
	claimAll(t, s, coll, a, "e1", "e2", "e3")

	at := base.Add(time.Second)
	n, err := s.MarkPublished(t.Context(), a, []any{"e1", "e2"}, at)
	if err != nil || n != 2 {
		t.Fatalf("MarkPublished(e1, e2) = %d, %v; want 2, nil", n, err)
	}
	for _, id := range []string{"e1", "e2"} {
		if e := get(t, coll, id); e.Status != events.StatusPublished || !e.PublishedAt.Equal(at) {
			t.Errorf("%s: status %s publishedAt %s, want PUBLISHED at %s", id, e.Status, e.PublishedAt, at)
		}
	}
	if e := get(t, coll, "e3"); e.Status != events.StatusProcessing || has(t, coll, "e3", events.FieldPublishedAt) {
		t.Errorf("e3 (not in the call): status %s, publishedAt %s; want PROCESSING without publishedAt", e.Status, e.PublishedAt)
	}
	// Marking again changes nothing: they are no longer PROCESSING.
	if n, err := s.MarkPublished(t.Context(), a, []any{"e1"}, at); err != nil || n != 0 {
		t.Errorf("MarkPublished of a PUBLISHED event = %d, %v; want 0, nil", n, err)
	}
	if n, err := s.MarkPublished(t.Context(), a, nil, at); err != nil || n != 0 {
		t.Errorf("MarkPublished(no ids) = %d, %v; want 0, nil", n, err)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	a := lease("a")
	claimAll(t, s, coll, a, "retry", "refund", "fail", "keep")
	retryAt := base.Add(4 * time.Second)

	for _, r := range []events.Release{
		{IDs: []any{"retry"}, Status: events.StatusNew, LastError: "nacked", RetryAt: retryAt},
		{IDs: []any{"refund"}, Status: events.StatusNew, LastError: "broker down", Refund: true},
		{IDs: []any{"fail"}, Status: events.StatusFailed, LastError: "gave up"},
	} {
		if n, err := s.Release(t.Context(), a, r); err != nil || n != 1 {
			t.Fatalf("Release(%v to %s) = %d, %v; want 1, nil", r.IDs, r.Status, n, err)
		}
	}

	type view struct {
		Status                              events.Status
		Attempts                            int
		LastError                           string
		RetryAt, FailedAt                   time.Time
		WorkerID, Token, ProcessingAt, Left bool // fields still present
	}
	look := func(id string) view {
		e := get(t, coll, id)
		return view{
			Status: e.Status, Attempts: e.Attempts, LastError: e.LastError, RetryAt: e.RetryAt, FailedAt: e.FailedAt,
			WorkerID: has(t, coll, id, events.FieldWorkerID), Token: has(t, coll, id, events.FieldClaimToken),
			ProcessingAt: has(t, coll, id, events.FieldProcessingAt),
		}
	}
	want := map[string]view{
		"retry":  {Status: events.StatusNew, Attempts: 1, LastError: "nacked", RetryAt: retryAt},
		"refund": {Status: events.StatusNew, Attempts: 0, LastError: "broker down"},
		// FAILED keeps who had it last, for the operator; the token goes.
		"fail": {Status: events.StatusFailed, Attempts: 1, LastError: "gave up", FailedAt: a.At, WorkerID: true, ProcessingAt: true},
		"keep": {Status: events.StatusProcessing, Attempts: 1, WorkerID: true, Token: true, ProcessingAt: true},
	}
	got := map[string]view{}
	for id := range want {
		got[id] = look(id)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events after release (-want +got):\n%s", diff)
	}

	if n, err := s.Release(t.Context(), a, events.Release{IDs: []any{"keep"}, Status: events.StatusPublished}); err == nil || n != 0 {
		t.Errorf("Release to PUBLISHED = %d, %v; want 0 and an error", n, err)
	}
	if e := get(t, coll, "keep"); e.Status != events.StatusProcessing {
		t.Errorf("a refused release changed keep to %s", e.Status)
	}
	if n, err := s.Release(t.Context(), a, events.Release{Status: events.StatusNew}); err != nil || n != 0 {
		t.Errorf("Release(no ids) = %d, %v; want 0, nil", n, err)
	}
}
