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
// a pattern of lastError chooses the events.
func TestRequeueSpreadsOverTime(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	for i := range 5 {
		insert(t, coll, ev(string(rune('a'+i)), events.StatusFailed, ago(time.Duration(10-i)*time.Minute),
			field(events.FieldLastError, "returned 312 NO_ROUTE"), field(events.FieldRetryAt, ago(time.Hour))))
	}
	insert(t, coll, ev("other", events.StatusFailed, ago(time.Hour), field(events.FieldLastError, "nacked")))
	n, err := s.Requeue(t.Context(), mongo.RequeueFilter{ErrorPattern: "^returned .* NO_ROUTE$", PerSecond: 2, Now: base}, false)
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
		t.Errorf("an event of another cause was requeued")
	}
}
