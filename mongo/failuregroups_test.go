package mongo_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// TestFailureGroupsGroupsByStoredCause: the FAILED events, not skipped,
// grouped by the cause stored on them (stored first where missing),
// largest group first, each with its newest event; bounded to the newest
// limit, saying so.
func TestFailureGroupsGroupsByStoredCause(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	newer := ev("c", events.StatusFailed, ago(time.Minute),
		field(events.FieldLastError, `returned 312 NO_ROUTE for "c"`),
		field(events.FieldAttemptErrors, bson.A{bson.D{{Key: "at", Value: ago(time.Minute)}, {Key: "reason", Value: "returned"}}}))
	insert(t, coll,
		failedWith("a", "returned", `returned 312 NO_ROUTE for "a"`),
		failedWith("b", "returned", `returned 7 NO_ROUTE for "b"`),
		newer,
		failedWith("d", "max_attempts", "gave up after 5 attempts"),
		failedWith("skipped", "returned", `returned 312 NO_ROUTE for "s"`, field(events.FieldSkippedAt, ago(time.Minute))),
		ev("n", events.StatusNew, ago(time.Hour), field(events.FieldLastError, "x 1")),
	)
	at := time.Now().UTC().Truncate(time.Millisecond)
	g, err := s.FailureGroups(t.Context(), at, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []events.FailureGroup{
		{Reason: "returned", Cause: `returned <n> NO_ROUTE for "…"`, Count: 3, Example: "c"},
		{Reason: "max_attempts", Cause: "gave up after <n> attempts", Count: 1, Example: "d"},
	}
	ignoreLatest := func(gs []events.FailureGroup) []events.FailureGroup {
		out := append([]events.FailureGroup(nil), gs...)
		for i := range out {
			out[i].Latest = time.Time{}
		}
		return out
	}
	if diff := cmp.Diff(want, ignoreLatest(g.Groups)); diff != "" || g.Read != 4 || g.Capped || !g.At.Equal(at) {
		t.Errorf("groups (-want +got):\n%s\nread %d, capped %v, at %v", diff, g.Read, g.Capped, g.At)
	}
	if !has(t, coll, "a", events.FieldFailureCause) {
		t.Error("the causes were not stored: a group would not choose its events")
	}
	// The newest FAILED events as read, the skipped one too, for the
	// FAILED list's first page.
	if len(g.Newest) != 5 || !g.NewestAll {
		t.Errorf("newest = %d events, all %v; want the 5 FAILED, all", len(g.Newest), g.NewestAll)
	}
	// Bounded: the newest 2 of the 5, the skipped one (written last of
	// those an hour old) among them and not grouped.
	g, err = s.FailureGroups(t.Context(), at, 2)
	if err != nil {
		t.Fatal(err)
	}
	if g.Read != 1 || !g.Capped || len(g.Newest) != 2 || g.NewestAll {
		t.Errorf("bounded to 2: read %d, capped %v, newest %d, all %v; want 1 grouped, capped, 2 newest, not all",
			g.Read, g.Capped, len(g.Newest), g.NewestAll)
	}
}

// TestFailureGroupsReadsOnceWhenNothingIsNew: the groups are one read of
// the FAILED events; the causes of new failures are stored from that
// read, with one write per cause, and a read with nothing new writes
// nothing.
func TestFailureGroupsReadsOnceWhenNothingIsNew(t *testing.T) {
	t.Parallel()
	s, rec := mongotest.RecordingStore(t)
	insert(t, s.Collection(),
		failedWith("a", "returned", `returned 312 NO_ROUTE for "a"`),
		failedWith("b", "returned", `returned 7 NO_ROUTE for "b"`),
		failedWith("c", "max_attempts", "gave up after 5 attempts"),
	)
	commands := func() map[string]int {
		n := map[string]int{}
		for _, sent := range rec.Take() {
			n[sent.Name]++
		}
		return n
	}
	rec.Take()
	g, err := s.FailureGroups(t.Context(), time.Now(), 100)
	if err != nil {
		t.Fatal(err)
	}
	if got := commands(); got["find"] != 1 || got["update"] != 2 {
		t.Errorf("first read sent %v, want 1 find and 2 updates (one per new cause)", got)
	}
	for _, gr := range g.Groups {
		if gr.Unclassified != 0 {
			t.Errorf("group %+v counts events as unclassified whose cause was just stored", gr)
		}
	}
	if _, err := s.FailureGroups(t.Context(), time.Now(), 100); err != nil {
		t.Fatal(err)
	}
	if got := commands(); got["find"] != 1 || got["update"] != 0 {
		t.Errorf("second read sent %v, want 1 find and no update", got)
	}
}
