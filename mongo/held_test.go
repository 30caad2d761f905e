package mongo_test

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// Any number of held aggregates, and the rest still flows: with far more
// aggregates held by FAILED events than a claim names to the server, each
// with NEW events waiting, ahead of healthy events, two claims take every
// healthy event and none of the held ones. Before, the claim's window
// filled with the held events and it returned nothing.
//
// It runs the store's own strategy for the server at hand: the single
// find on FerretDB, the split finds on MongoDB (OUTBOX_TEST_MONGO_URI, as
// the CI workflow's MongoDB job sets it). The split finds name held keys
// to the server in a $nor, which FerretDB evaluates too slowly for a
// test of this size.
func TestClaimPastManyHeldAggregates(t *testing.T) {
	t.Parallel()
	const held, waiting, healthy = 2000, 2, 60
	s, coll := setup(t)
	at := ago(time.Hour)
	var docs []bson.D
	for i := range held {
		a := agg(fmt.Sprintf("held-%d", i))
		docs = append(docs, ev(fmt.Sprintf("held-%d-f", i), events.StatusFailed, at, a...))
		for j := range waiting {
			docs = append(docs, ev(fmt.Sprintf("held-%d-%d", i, j), events.StatusNew, at.Add(time.Duration(1+j)*time.Millisecond), a...))
		}
	}
	for i := range healthy {
		docs = append(docs, ev(fmt.Sprintf("ok-%d", i), events.StatusNew, at.Add(time.Second+time.Duration(i)*time.Millisecond), agg(fmt.Sprintf("ok-%d", i))...))
	}
	for chunk := range slices.Chunk(docs, 1000) {
		insert(t, coll, chunk...)
	}

	claimed := map[string]bool{}
	for i, draining := range []bool{false, true} {
		res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: fmt.Sprint("t", i), At: base},
			events.ClaimLimit{Events: 500, Ordered: true, FailedHolds: true, Draining: draining})
		if err != nil {
			t.Fatalf("claim %d: %v", i+1, err)
		}
		for _, c := range res.Claimed {
			claimed[fmt.Sprint(c.ID)] = true
		}
	}
	for i := range healthy {
		if id := fmt.Sprintf("ok-%d", i); !claimed[id] {
			t.Errorf("healthy event %s not claimed within two claims", id)
		}
	}
	for id := range claimed {
		if len(id) > 4 && id[:4] == "held" {
			t.Errorf("claimed %s, an event of a held aggregate", id)
		}
	}
}

// The one-at-a-time fallback keeps order: an event whose claim the server
// refuses holds its aggregate, so the later events of that aggregate read
// with it are left NEW, whatever the refused batch update did to them.
func TestClaimFallbackHoldsTheRefusedAggregate(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		at := ago(time.Hour)
		a := agg("a")
		insert(t, coll,
			ev("a-0", events.StatusNew, at, a...),
			ev("a-1", events.StatusNew, at.Add(time.Millisecond), append(a, field(events.FieldAttempts, int64(math.MaxInt64)))...),
			ev("a-2", events.StatusNew, at.Add(2*time.Millisecond), a...),
			ev("a-3", events.StatusNew, at.Add(3*time.Millisecond), a...),
			ev("b-0", events.StatusNew, at.Add(4*time.Millisecond), agg("b")...),
		)
		claim := func(token string, limit events.ClaimLimit) ([]string, []events.Rejected) {
			t.Helper()
			res, err := s.Claim(t.Context(), events.Lease{WorkerID: "w", Token: token, At: base}, limit)
			if err != nil {
				t.Fatalf("Claim: %v", err)
			}
			got := ids(res.Claimed)
			slices.Sort(got)
			return got, res.Rejected
		}
		got, rejected := claim("t1", events.ClaimLimit{Events: 100, Ordered: true, FailedHolds: true})
		if want := []string{"a-0", "b-0"}; !slices.Equal(got, want) {
			t.Errorf("claimed %v, want %v: nothing of a after the refused a-1", got, want)
		}
		if rej := rejectedIDs(t, rejected); !slices.Equal(rej, []string{"a-1"}) {
			t.Errorf("rejected %v, want [a-1]", rej)
		}
		for _, id := range []string{"a-2", "a-3"} {
			if e := get(t, coll, id); e.Status != events.StatusNew || e.Attempts != 0 || e.ClaimToken != "" {
				t.Errorf("%s: %s, attempts %d, token %q; want NEW as it was", id, e.Status, e.Attempts, e.ClaimToken)
			}
		}
		// Under continue the FAILED a-1 holds nothing: once a-0 is
		// published, the next claim takes the rest.
		if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: "a-0"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}}}); err != nil {
			t.Fatal(err)
		}
		if got, _ := claim("t2", events.ClaimLimit{Events: 100, Ordered: true}); !slices.Equal(got, []string{"a-2", "a-3"}) {
			t.Errorf("claimed under continue %v, want [a-2 a-3]", got)
		}
	})
}
