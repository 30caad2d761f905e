package mongo_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestActionsAreRecorded: actions come back newest first, their free text
// bounded.
func TestActionsAreRecorded(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	for i, a := range []mongo.Action{
		{At: ago(time.Hour), By: "ana", Name: "requeue", Reason: "broker fixed", Target: "ids: e1", Count: 1, Source: "cli"},
		{At: ago(time.Minute), By: "bo", Name: "skip", Reason: strings.Repeat("x", 5000), Target: "ids: e2", Count: 1, Source: "console"},
	} {
		if err := s.RecordAction(t.Context(), a); err != nil {
			t.Fatalf("RecordAction %d: %v", i, err)
		}
	}
	got, err := s.Actions(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].By != "bo" || got[1].By != "ana" || got[1].Reason != "broker fixed" || !got[1].At.Equal(ago(time.Hour)) {
		t.Fatalf("Actions = %+v", got)
	}
	if len(got[0].Reason) > 1<<10 {
		t.Errorf("a reason of 5,000 bytes was kept whole (%d bytes)", len(got[0].Reason))
	}
}

// TestRequeueSpreadsOverTime: a requeue PerSecond a second makes the
// oldest chunk due at once and each later chunk a second after the last;
// the selected events are the ones requeued.
func TestRequeueSpreadsOverTime(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	for i := range 5 {
		insert(t, coll, ev(string(rune('a'+i)), events.StatusFailed, ago(time.Duration(10-i)*time.Minute),
			field(events.FieldLastError, "returned 312 NO_ROUTE"), field(events.FieldRetryAt, ago(time.Hour))))
	}
	insert(t, coll, ev("other", events.StatusFailed, ago(time.Hour), field(events.FieldLastError, "nacked")))
	selected := []any{"a", "b", "c", "d", "e"}
	n, err := s.Requeue(t.Context(), mongo.RequeueFilter{Selected: selected, PerSecond: 2, Now: base}, false)
	if err != nil || n != 5 {
		t.Fatalf("Requeue = %d, %v; want 5", n, err)
	}
	var due []time.Time
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		e := get(t, coll, id)
		if e.Status != events.StatusNew || e.Attempts != 0 {
			t.Errorf("%s: %s with %d attempts, want NEW with 0", id, e.Status, e.Attempts)
		}
		due = append(due, e.RetryAt)
	}
	want := []time.Time{{}, {}, base.Add(time.Second), base.Add(time.Second), base.Add(2 * time.Second)}
	if !slices.EqualFunc(due, want, time.Time.Equal) {
		t.Errorf("due at %v, want %v", due, want)
	}
	if e := get(t, coll, "other"); e.Status != events.StatusFailed {
		t.Errorf("an event not selected was requeued")
	}
}

// TestActionIntentThenEnd: an action's intent is recorded as started with
// no count, its progress written as it goes, and its end completes the
// same record.
func TestActionIntentThenEnd(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	id, err := s.StartAction(t.Context(), mongo.Action{At: ago(time.Minute), By: "ana", Name: "requeue", Reason: "r", Target: "ids: e1", Count: 99, Source: "console", From: "10.0.0.7:5123"})
	if err != nil {
		t.Fatal(err)
	}
	read := func() mongo.Action {
		t.Helper()
		got, err := s.Actions(t.Context(), 10)
		if err != nil || len(got) != 1 || got[0].ID != id {
			t.Fatalf("Actions = %+v, %v; want the one record", got, err)
		}
		return got[0]
	}
	if a := read(); a.State != mongo.ActionStarted || a.Count != 0 || a.From != "10.0.0.7:5123" || !a.Ended.IsZero() {
		t.Errorf("intent = %+v, want started, 0 events, from the client's address", a)
	}
	if err := s.ProgressAction(t.Context(), id, 40); err != nil {
		t.Fatal(err)
	}
	if a := read(); a.Count != 40 || a.State != mongo.ActionStarted {
		t.Errorf("after progress = %+v, want 40 and still started", a)
	}
	if err := s.FinishAction(t.Context(), id, mongo.ActionFailed, 57, "requeue events (57 done): timeout", ago(0)); err != nil {
		t.Fatal(err)
	}
	if a := read(); a.Count != 57 || a.State != mongo.ActionFailed || !strings.Contains(a.Error, "timeout") || !a.Ended.Equal(ago(0)) {
		t.Errorf("after the end = %+v, want failed with 57 and the error", a)
	}
}
