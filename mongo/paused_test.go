package mongo_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// pausedOutbox writes the outbox of the pause tests: the paused type is
// order.paid.
//
//	a: a1 order.created, a2 order.paid, a3 order.created
//	b: b1, b2 order.created
//	c: c1 order.paid
//	u1 order.paid and u2 order.created, without an aggregate
func pausedOutbox(t *testing.T, coll *driver.Collection) {
	t.Helper()
	at := ago(time.Hour)
	e := func(id, typ string, ms int, extra ...bson.E) bson.D {
		return withType(ev(id, events.StatusNew, at.Add(time.Duration(ms)*time.Millisecond), extra...), typ)
	}
	insert(t, coll,
		e("a1", "order.created", 0, agg("a")...),
		e("a2", "order.paid", 1, agg("a")...),
		e("a3", "order.created", 2, agg("a")...),
		e("b1", "order.created", 3, agg("b")...),
		e("b2", "order.created", 4, agg("b")...),
		e("c1", "order.paid", 5, agg("c")...),
		e("u1", "order.paid", 6),
		e("u2", "order.created", 7),
	)
}

func pause(t *testing.T, s *mongo.Store, typ string) {
	t.Helper()
	if ok, err := s.Pause(t.Context(), events.Pause{Type: typ, By: "ana", Reason: "billing is down", At: base}); err != nil || !ok {
		t.Fatalf("Pause(%s) = %t, %v; want true", typ, ok, err)
	}
}

// TestPausedTypeHoldsItsAggregates: with ordering, an event of a paused
// type is not claimed and holds the later events of its aggregate, of
// any type, while the other aggregates and the unordered events flow; it
// stays NEW with no attempt counted. Resumed, the held events are claimed
// in order. Both claim strategies agree.
func TestPausedTypeHoldsItsAggregates(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		pausedOutbox(t, coll)
		pause(t, s, "order.paid")
		limit := events.ClaimLimit{Events: 100, Ordered: true, FailedHolds: true}
		claim := func(token string) []events.Claimed {
			t.Helper()
			res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: token, At: base}, limit)
			if err != nil {
				t.Fatalf("Claim: %v", err)
			}
			return res.Claimed
		}
		first := claim("t1")
		if diff := cmp.Diff([]string{"a1", "b1", "b2", "u2"}, ids(first)); diff != "" {
			t.Errorf("claim with order.paid paused (-want +got):\n%s", diff)
		}
		for _, id := range []string{"a2", "a3", "c1", "u1"} {
			if e := get(t, coll, id); e.Status != events.StatusNew || e.Attempts != 0 {
				t.Errorf("%s is %s with %d attempts, want NEW with none", id, e.Status, e.Attempts)
			}
		}
		held, err := s.Held(t.Context(), base, true)
		if err != nil {
			t.Fatal(err)
		}
		if held.Aggregates != 1 || !held.OldestWaiting.Equal(ago(time.Hour).Add(2*time.Millisecond)) {
			t.Errorf("Held = %+v, want aggregate a held (a3 waiting behind a2)", held)
		}
		holders, _, err := s.Holders(t.Context(), base, true, 10)
		if err != nil {
			t.Fatal(err)
		}
		var holding []string
		for _, h := range holders {
			holding = append(holding, h.Doc.Lookup(events.FieldID).StringValue())
		}
		if diff := cmp.Diff([]string{"a2", "c1"}, holding); diff != "" {
			t.Errorf("holders (-want +got):\n%s", diff)
		}
		if n, err := s.MarkPublished(t.Context(), events.Lease{WorkerID: "w", Token: "t1"}, mongotest.IDs(first), base); err != nil || n != len(first) {
			t.Fatalf("MarkPublished = %d, %v", n, err)
		}
		if got := claim("t2"); len(got) != 0 {
			t.Errorf("a claim still paused took %v", ids(got))
		}

		if ok, err := s.Resume(t.Context(), "order.paid"); err != nil || !ok {
			t.Fatalf("Resume = %t, %v; want true", ok, err)
		}
		if diff := cmp.Diff([]string{"a2", "a3", "c1", "u1"}, ids(claim("t3"))); diff != "" {
			t.Errorf("claim after the resume (-want +got):\n%s", diff)
		}
	})
}

// TestPausedTypeWithoutOrdering: without ordering only the paused type's
// events wait.
func TestPausedTypeWithoutOrdering(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		pausedOutbox(t, coll)
		pause(t, s, "order.paid")
		res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: "t1", At: base}, events.ClaimLimit{Events: 100})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"a1", "a3", "b1", "b2", "u2"}, slices.Sorted(slices.Values(ids(res.Claimed)))); diff != "" {
			t.Errorf("unordered claim with order.paid paused (-want +got):\n%s", diff)
		}
	})
}

// TestPauseElsewhere: a pause written by another process acts on the
// first claim that reads the paused types after it; before that read, a
// claim uses the set it read last (for at most PausedTypesMaxAge). Ordered
// and not.
func TestPauseElsewhere(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprintf("ordered=%t", ordered), func(t *testing.T) {
			t.Parallel()
			claimer, coll := setup(t)
			operator := mongo.New(coll.Database().Client(), mongo.Config{Database: coll.Database().Name()})
			mongo.SetPausedMaxAge(claimer, time.Hour)
			limit := events.ClaimLimit{Events: 1, Ordered: ordered}
			claim := func(token string) []string {
				t.Helper()
				res, err := claimer.Claim(t.Context(), events.Lease{WorkerID: "w", Token: token, At: base}, limit)
				if err != nil {
					t.Fatal(err)
				}
				return ids(res.Claimed)
			}
			insert(t, coll,
				ev("e1", events.StatusNew, ago(3*time.Second)),
				ev("e2", events.StatusNew, ago(2*time.Second)),
				ev("e3", events.StatusNew, ago(time.Second)),
			)
			if got := claim("t1"); len(got) != 1 {
				t.Fatalf("first claim took %v, want e1", got)
			}
			pause(t, operator, "order.created")
			if got := claim("t2"); len(got) != 1 {
				t.Fatalf("a claim within the paused types' max age took %v, want e2 (the set read last)", got)
			}
			mongo.SetPausedMaxAge(claimer, 0)
			if got := claim("t3"); len(got) != 0 {
				t.Errorf("the claim after the paused types were read again took %v, want none", got)
			}
			if ok, err := operator.Resume(t.Context(), "order.created"); err != nil || !ok {
				t.Fatalf("Resume = %t, %v", ok, err)
			}
			if got := claim("t4"); len(got) != 1 {
				t.Errorf("the claim after the resume took %v, want e3", got)
			}
		})
	}
}

// TestPauseRecords: a pause keeps who, why and when; pausing a paused
// type changes nothing and says so, as does resuming one not paused.
func TestPauseRecords(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	pause(t, s, "order.paid")
	if ok, err := s.Pause(t.Context(), events.Pause{Type: "order.paid", By: "bob", Reason: "again", At: base.Add(time.Hour)}); err != nil || ok {
		t.Errorf("second Pause = %t, %v; want false, nil", ok, err)
	}
	pause(t, s, "invoice.sent")
	got, err := s.PausedTypes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []events.Pause{
		{Type: "invoice.sent", By: "ana", Reason: "billing is down", At: base},
		{Type: "order.paid", By: "ana", Reason: "billing is down", At: base},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PausedTypes (-want +got):\n%s", diff)
	}
	if ok, err := s.Resume(t.Context(), "order.shipped"); err != nil || ok {
		t.Errorf("Resume of a type not paused = %t, %v; want false, nil", ok, err)
	}
	if _, err := s.Pause(t.Context(), events.Pause{}); err == nil {
		t.Error("Pause without a type: no error")
	}
}

// TestPausedTypesCost: with nothing paused an idle ordered or unordered
// tick still costs one find, and claims read the paused types at most
// once per PausedTypesMaxAge: the hot path's commands stay as they were.
func TestPausedTypesCost(t *testing.T) {
	t.Parallel()
	s, rec := mongotest.RecordingStore(t)
	mongo.SetPausedMaxAge(s, time.Hour)
	pausedFinds := func() (finds, paused int) {
		for _, sent := range rec.Take() {
			if sent.Name != "find" {
				continue
			}
			finds++
			if coll, _ := sent.Command.Lookup("find").StringValueOK(); coll == s.Collection().Name()+mongo.PausedSuffix {
				paused++
			}
		}
		return finds, paused
	}
	for _, ordered := range []bool{true, false} {
		if _, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: "idle", At: base}, events.ClaimLimit{Events: 10, Ordered: ordered}); err != nil {
			t.Fatal(err)
		}
		if finds, paused := pausedFinds(); finds != 1 || paused != 0 {
			t.Errorf("ordered=%t: an idle claim sent %d finds (%d of the paused types), want 1 (0)", ordered, finds, paused)
		}
	}
	insert(t, s.Collection(), ev("e1", events.StatusNew, ago(time.Second)), ev("e2", events.StatusNew, ago(time.Second)))
	rec.Take()
	for i := range 2 {
		if _, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: fmt.Sprint("t", i), At: base}, events.ClaimLimit{Events: 1, Ordered: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, paused := pausedFinds(); paused != 1 {
		t.Errorf("two claims within the max age read the paused types %d times, want 1", paused)
	}
}
