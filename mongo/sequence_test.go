package mongo_test

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// sequenceCounts records what a store counts of the sequences it meets.
type sequenceCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func countSequences(s *mongo.Store) *sequenceCounts {
	c := &sequenceCounts{n: map[string]int{}}
	mongo.SetSequenceAnomaly(s, func(kind string, n int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.n[kind] += n
	})
	return c
}

func (c *sequenceCounts) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := maps.Clone(c.n)
	clear(c.n)
	return out
}

// withSequences runs test on each claim strategy (eachClaimStrategy),
// with the store's sequence counts, once docs are inserted.
func withSequences(t *testing.T, docs []bson.D, test func(t *testing.T, s *mongo.Store, coll *driver.Collection, counts *sequenceCounts)) {
	t.Helper()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		counts := countSequences(s)
		insert(t, coll, docs...)
		test(t, s, coll, counts)
	})
}

// seq is the fields of an event of aggregate a with sequence n.
func seq(a string, n any) []bson.E {
	return append(agg(a), field(events.FieldSequence, n))
}

// claimOrdered claims with ordering and returns the _ids claimed, in the
// order the store read them.
func claimOrdered(t *testing.T, s *mongo.Store, token string, n int) []string {
	t.Helper()
	limit := events.ClaimLimit{Events: n, Ordered: true, FailedHolds: true}
	docs, _, err := s.ReadClaimable(t.Context(), base, limit)
	if err != nil {
		t.Fatalf("ReadClaimable: %v", err)
	}
	var out []string
	for _, d := range docs {
		out = append(out, d.Lookup(events.FieldID).StringValue())
	}
	if _, err := s.ClaimRead(t.Context(), events.Lease{WorkerID: "w", Token: token, At: base}, docs, limit); err != nil {
		t.Fatalf("ClaimRead: %v", err)
	}
	return out
}

// TestClaimTakesEarlierVersionIn: an aggregate's version 1 sorts after
// version 2 by createdAt (its producer's clock ahead), past the claim's
// read of one event: the claim takes version 1 in, before version 2, and
// the read-ahead does not give it again.
func TestClaimTakesEarlierVersionIn(t *testing.T) {
	t.Parallel()
	at := ago(time.Hour)
	withSequences(t, []bson.D{
		ev("v2", events.StatusNew, at, seq("a", int64(2))...),
		ev("x", events.StatusNew, at.Add(time.Millisecond), agg("b")...),
		ev("v1", events.StatusNew, at.Add(2*time.Second), seq("a", int32(1))...),
		ev("v3", events.StatusNew, at.Add(3*time.Second), seq("a", 3.0)...),
	}, func(t *testing.T, s *mongo.Store, coll *driver.Collection, counts *sequenceCounts) {
		if diff := cmp.Diff([]string{"v1", "v2"}, claimOrdered(t, s, "t1", 1)); diff != "" {
			t.Errorf("first claim (-want +got):\n%s", diff)
		}
		// v2 goes after v1, whose createdAt is later: counted, not silent.
		if diff := cmp.Diff(map[string]int{events.SequenceReordered: 1}, counts.take()); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"x"}, claimOrdered(t, s, "t2", 1)); diff != "" {
			t.Errorf("second claim (-want +got):\n%s", diff) // v3 waits: its key is held
		}
	})
}

// TestClaimWaitsForEarlierVersion: where the earlier version cannot be
// claimed now (backing off, parked, FAILED under wait), the later ones
// stay NEW with everything after them of their aggregate, counted as
// waiting; the rest of the batch goes. Once the earlier one is due, both
// are claimed, in version order.
func TestClaimWaitsForEarlierVersion(t *testing.T) {
	t.Parallel()
	at := ago(time.Hour)
	withSequences(t, []bson.D{
		ev("a2", events.StatusNew, at, seq("a", int64(2))...),
		ev("a-plain", events.StatusNew, at.Add(time.Millisecond), agg("a")...),
		ev("b2", events.StatusNew, at.Add(2*time.Millisecond), seq("b", int64(2))...),
		ev("u", events.StatusNew, at.Add(3*time.Millisecond)),
		ev("a1", events.StatusNew, at.Add(time.Second), append(seq("a", int64(1)), field(events.FieldRetryAt, base.Add(time.Minute)), field(events.FieldAttempts, 1))...),
		withType(ev("b1", events.StatusNew, at.Add(time.Second), seq("b", int64(1))...), "order.paid"),
	}, func(t *testing.T, s *mongo.Store, coll *driver.Collection, counts *sequenceCounts) {
		if ok, err := s.Pause(t.Context(), events.Pause{Type: "order.paid", By: "ana", Reason: "test", At: base}); err != nil || !ok {
			t.Fatalf("Pause = %t, %v", ok, err)
		}
		if diff := cmp.Diff([]string{"u"}, claimOrdered(t, s, "t1", 10)); diff != "" {
			t.Errorf("claim while version 1 backs off or is paused (-want +got):\n%s", diff)
		}
		// On MongoDB the claim reads the events backing off first and
		// holds their aggregates by key (a2 and a-plain are not read);
		// on FerretDB the read meets a1 after a2, and the sequence check
		// leaves a2 and a-plain NEW.
		want := map[string]int{events.SequenceWaiting: 3, events.SequenceMixed: 1}
		if mongo.SplitClaim(s) {
			want = map[string]int{events.SequenceWaiting: 1}
		}
		if diff := cmp.Diff(want, counts.take()); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
		if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: "a1"}}, bson.D{{Key: "$unset", Value: bson.D{{Key: events.FieldRetryAt, Value: ""}}}}); err != nil {
			t.Fatal(err)
		}
		// a-plain, without a sequence, keeps its createdAt place.
		if diff := cmp.Diff([]string{"a1", "a-plain", "a2"}, claimOrdered(t, s, "t2", 10)); diff != "" {
			t.Errorf("claim once version 1 is due (-want +got):\n%s", diff)
		}
	})
}

// TestClaimCountsSequenceAnomalies: a version lower than one already
// published, or equal to one published or in the batch, is claimed (it
// never waits for anything) and counted; a sequence that is not a number
// orders nothing and holds nothing back (the event fails as poison when
// it becomes a message).
func TestClaimCountsSequenceAnomalies(t *testing.T) {
	t.Parallel()
	at := ago(time.Hour)
	withSequences(t, []bson.D{
		ev("a5", events.StatusPublished, at, seq("a", int64(5))...),
		ev("a3", events.StatusNew, at.Add(time.Millisecond), seq("a", int64(3))...),
		ev("b2", events.StatusPublished, at, seq("b", int64(2))...),
		ev("b2-again", events.StatusNew, at.Add(time.Millisecond), seq("b", int64(2))...),
		ev("c4", events.StatusNew, at.Add(2*time.Millisecond), seq("c", int64(4))...),
		ev("c4-again", events.StatusNew, at.Add(3*time.Millisecond), seq("c", int64(4))...),
		ev("d-bad", events.StatusNew, at.Add(4*time.Second), seq("d", "1")...),
		ev("d2", events.StatusNew, at.Add(4*time.Millisecond), seq("d", int64(2))...),
		ev("e-neg", events.StatusNew, at.Add(5*time.Second), seq("e", int64(-1))...),
		ev("e0", events.StatusNew, at.Add(5*time.Millisecond), seq("e", int64(0))...),
	}, func(t *testing.T, s *mongo.Store, coll *driver.Collection, counts *sequenceCounts) {
		got := claimOrdered(t, s, "t1", 20)
		want := []string{"a3", "b2-again", "c4", "c4-again", "d2", "e0", "d-bad", "e-neg"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("claim (-want +got):\n%s", diff)
		}
		wantCounts := map[string]int{events.SequenceBehind: 1, events.SequenceRepeat: 2, events.SequenceMixed: 2}
		if diff := cmp.Diff(wantCounts, counts.take()); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
	})
}
