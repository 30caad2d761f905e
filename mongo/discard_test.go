package mongo_test

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestDiscardIsTerminalAndFreesItsAggregate: a discard keeps the event
// (FAILED, with who, when and why), lets its aggregate's later events
// pass as a skip does (an event not skipped yet is skipped by the same
// hand; one skipped earlier keeps its skip's record), stamps it with
// the action, and no requeue takes it back, not even one naming it.
func TestDiscardIsTerminalAndFreesItsAggregate(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	order := func(id string) []bson.E {
		return []bson.E{field(events.FieldAggregateType, "order"), field(events.FieldAggregateID, id), field(events.FieldLastError, "nacked")}
	}
	insert(t, coll,
		ev("a", events.StatusFailed, ago(3*time.Hour), order("1")...),
		ev("a-later", events.StatusNew, ago(2*time.Hour), order("1")...),
		ev("b", events.StatusFailed, ago(3*time.Hour), append(order("2"),
			field(events.FieldSkippedBy, "sam"), field(events.FieldSkippedAt, ago(time.Hour)),
			field(events.FieldSkipReason, "looked"), field(events.FieldSkipped, true))...),
		ev("c", events.StatusPublished, ago(time.Hour)),
	)
	if h, _, err := s.Holders(t.Context(), base, true, 10); err != nil || len(h) != 1 {
		t.Fatalf("before the discard, Holders = %v, %v; want order/1 held by a", h, err)
	}
	action, at := bson.NewObjectID(), base
	n, err := s.DiscardSelected(t.Context(), []any{"a", "b", "c"}, "ada", "a duplicate of order 7's", at, action)
	if err != nil || n != 2 {
		t.Fatalf("DiscardSelected = %d, %v; want the two FAILED events", n, err)
	}
	a, b := get(t, coll, "a"), get(t, coll, "b")
	if a.Status != events.StatusFailed || a.DiscardedBy != "ada" || !a.DiscardedAt.Equal(at) || a.DiscardReason != "a duplicate of order 7's" {
		t.Errorf("a = %s by %q at %v for %q; want FAILED, discarded by ada at %v with the reason", a.Status, a.DiscardedBy, a.DiscardedAt, a.DiscardReason, at)
	}
	if a.SkippedBy != "ada" || a.SkippedAt.IsZero() || !has(t, coll, "a", events.FieldSkipped) {
		t.Errorf("a's skip = %q at %v; want skipped by ada, so that its aggregate flows", a.SkippedBy, a.SkippedAt)
	}
	if b.DiscardedBy != "ada" || b.SkippedBy != "sam" || b.SkipReason != "looked" {
		t.Errorf("b = discarded by %q, skipped by %q for %q; want discarded by ada, its skip by sam kept", b.DiscardedBy, b.SkippedBy, b.SkipReason)
	}
	if get(t, coll, "c").Status != events.StatusPublished || has(t, coll, "c", events.FieldDiscardedAt) {
		t.Error("a PUBLISHED event was discarded")
	}
	if h, _, err := s.Holders(t.Context(), base, true, 10); err != nil || len(h) != 0 {
		t.Errorf("after the discard, Holders = %v, %v; want none: a discarded event holds nothing", h, err)
	}
	if got, err := s.Touched(t.Context(), action, []any{"a", "b", "c"}); err != nil || len(got) != 2 {
		t.Errorf("Touched = %v, %v; want a and b stamped with the discard", got, err)
	}

	// Terminal: no requeue takes it back, by id or at large; a second
	// discard keeps the first record.
	for name, f := range map[string]mongo.RequeueFilter{
		"by id": {IDs: []string{"a", "b"}}, "selected": {Selected: []any{"a", "b"}}, "all": {All: true},
	} {
		if n, err := s.Requeue(t.Context(), f, false); err != nil || n != 0 {
			t.Errorf("requeue %s = %d, %v; want 0: a discarded event stays", name, n, err)
		}
	}
	if n, err := s.DiscardSelected(t.Context(), []any{"a"}, "bob", "again", at.Add(time.Minute), bson.NewObjectID()); err != nil || n != 0 {
		t.Errorf("a second discard = %d, %v; want 0", n, err)
	}
	if n, err := s.Discard(t.Context(), []string{"a", "b"}, "bob", "again", at, true); err != nil || n != 0 {
		t.Errorf("Discard's dry run of discarded events = %d, %v; want 0", n, err)
	}
	if a := get(t, coll, "a"); a.DiscardedBy != "ada" || a.Status != events.StatusFailed {
		t.Errorf("a = %s discarded by %q; want FAILED, ada's record kept", a.Status, a.DiscardedBy)
	}
}

// TestDiscardedHoldsNothingInTheClaims: the claims pass a discarded
// event as they pass a skipped one, whether it was not skipped before
// or was skipped before the skipped flag existed (skippedAt alone: the
// discard writes the flag); a FAILED event not discarded still holds.
func TestDiscardedHoldsNothingInTheClaims(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		failed := func(id, agg string) bson.D {
			d := laneEvent(id, "order.created", agg, 0)
			d[3].Value = events.StatusFailed
			return d
		}
		old := append(failed("old", "b"), field(events.FieldSkippedAt, base))
		insert(t, coll, failed("fresh", "a"), old, failed("holds", "c"),
			laneEvent("a2", "order.created", "a", 10), laneEvent("b2", "order.created", "b", 11), laneEvent("c2", "order.created", "c", 12))
		if n, err := s.Discard(t.Context(), []string{"fresh", "old"}, "op", "duplicates", time.Now(), false); err != nil || n != 2 {
			t.Fatalf("Discard = %d, %v", n, err)
		}
		if !has(t, coll, "old", events.FieldSkipped) {
			t.Errorf("an event skipped before the flag existed was discarded without %s", events.FieldSkipped)
		}
		got := claimLane(t, s, "t", events.ClaimLimit{Events: 10, Ordered: true, FailedHolds: true})
		slices.Sort(got)
		if !slices.Equal(got, []string{"a2", "b2"}) {
			t.Errorf("claimed %v, want [a2 b2]: behind the discarded events, not behind the FAILED one", got)
		}
	})
}
