package mongo_test

// The database's fence on a real MongoDB single-node replica set, where
// transactions exist, started with testcontainers-go: deterministic
// interleavings of two replicas' claims through the store's read/write
// split (ReadClaimable, then ClaimRead), with a takeover between one
// replica's read and its write, and a race of a claim's write against
// the new owner's first read. It needs a Docker engine and skips, saying
// so, where there is none. FerretDB has no transactions, so nothing here
// can run on it (see fences_test.go for what does).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

func TestContainerFence(t *testing.T) {
	t.Parallel()
	client := testenv.ReplicaSet(t)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, r fenceRig)
	}{
		{"stale write after the new owner's read", staleWriteAfterRead},
		{"stale write after the new owner's claim", staleWriteAfterClaim},
		{"stale write before the takeover", staleWriteFirst},
		{"claim racing the takeover", claimRacingTakeover},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newFenceRig(t, client))
		})
	}
}

// fenceRig is one outbox on the replica set seen by two replicas, a (the
// old owner of partition p) and b (the new one), each with a store of its
// own; aggregates are aggregate ids whose events all fall in p.
type fenceRig struct {
	a, b       *mongo.Store
	coll       *driver.Collection
	p          int
	aggregates []string
}

func newFenceRig(t *testing.T, client *driver.Client) fenceRig {
	t.Helper()
	db := client.Database(testenv.UniqueName(t, "fence_"))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Logf("drop database %s: %v", db.Name(), err)
		}
	})
	replica := func() *mongo.Store {
		s := mongo.New(client, mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
		if err := s.Prepare(t.Context()); err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		if !s.SupportsTransactions() {
			t.Fatal("SupportsTransactions = false on a replica set, want true")
		}
		return s
	}
	a, b := replica(), replica()
	p, aggregates := aggregatesInOnePartition(t, 40)
	return fenceRig{a: a, b: b, coll: a.Collection(), p: p, aggregates: aggregates}
}

// aggregateEvent is NEW event id of order aggregate agg, the n-th of the
// test (createdAt n ms apart, an hour ago).
func aggregateEvent(id, agg string, n int) bson.D {
	at := time.Now().Add(-time.Hour).Truncate(time.Millisecond).Add(time.Duration(n) * time.Millisecond)
	return ev(id, events.StatusNew, at, field(events.FieldAggregateType, "order"), field(events.FieldAggregateID, agg))
}

// aggregatesInOnePartition returns n order aggregate ids whose events
// fall in one partition, and the partition.
func aggregatesInOnePartition(t *testing.T, n int) (int, []string) {
	t.Helper()
	partitionOf := func(agg string) int {
		doc := testenv.Marshal(t, aggregateEvent("x", agg, 0))
		return events.Partition(doc)
	}
	p := partitionOf("o-0")
	out := []string{"o-0"}
	for i := 1; len(out) < n; i++ {
		if agg := fmt.Sprintf("o-%d", i); partitionOf(agg) == p {
			out = append(out, agg)
		}
	}
	return p, out
}

// fenceLease is a replica's lease of one claim.
func fenceLease(worker string, n int) events.Lease {
	return events.Lease{WorkerID: worker, Token: fmt.Sprintf("%s-%d", worker, n), At: time.Now().UTC().Truncate(time.Millisecond)}
}

// holder is who holds an event: its status and claim token.
type holder struct {
	Status events.Status
	Token  string
}

// holders returns who holds each event, by _id.
func holders(t *testing.T, coll *driver.Collection) map[string]holder {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var all []struct {
		ID     string        `bson:"_id"`
		Status events.Status `bson:"status"`
		Token  string        `bson:"claimToken"`
	}
	if err := cur.All(t.Context(), &all); err != nil {
		t.Fatal(err)
	}
	out := map[string]holder{}
	for _, e := range all {
		out[e.ID] = holder{Status: e.Status, Token: e.Token}
	}
	return out
}

// wantHolders fails the test unless the events are held as want says.
func wantHolders(t *testing.T, coll *driver.Collection, want map[string]holder) {
	t.Helper()
	got := holders(t, coll)
	for id, w := range want {
		if got[id] != w {
			t.Errorf("event %s: %+v, want %+v", id, got[id], w)
		}
	}
}

// fenceTenure reads the tenure of partition p's fence.
func fenceTenure(t *testing.T, s *mongo.Store, p int) int64 {
	t.Helper()
	tenure, _ := fenceOf(t, s, p)
	return tenure
}

// aReadsThree inserts e1, e2 and e3 of the rig's first aggregate and
// returns a's read of them under tenure 1.
func aReadsThree(t *testing.T, r fenceRig) []bson.Raw {
	t.Helper()
	agg := r.aggregates[0]
	insert(t, r.coll, aggregateEvent("e1", agg, 1), aggregateEvent("e2", agg, 2), aggregateEvent("e3", agg, 3))
	docsA, _, err := r.a.ReadClaimable(t.Context(), time.Now(), fenceLimit(r.p, 1))
	if err != nil || len(docsA) != 3 {
		t.Fatalf("a's read = %d events, %v; want 3", len(docsA), err)
	}
	return docsA
}

// a holds p under tenure 1 and reads three events; b takes p (tenure 2)
// and reads them before a writes. a's write then aborts on the server,
// whatever the clocks say, and writes nothing; b claims the events.
func staleWriteAfterRead(t *testing.T, r fenceRig) {
	ctx := t.Context()
	docsA := aReadsThree(t, r)
	docsB, _, err := r.b.ReadClaimable(ctx, time.Now(), fenceLimit(r.p, 2))
	if err != nil || len(docsB) != 3 {
		t.Fatalf("b's read = %d events, %v; want 3", len(docsB), err)
	}
	if got := fenceTenure(t, r.a, r.p); got != 2 {
		t.Errorf("fence after b's read = %d, want b's tenure 2", got)
	}
	res, err := r.a.ClaimRead(ctx, fenceLease("a", 1), docsA, fenceLimit(r.p, 1))
	if !errors.Is(err, events.ErrFenced) {
		t.Fatalf("a's write after b's read = %d claimed, %v; want ErrFenced", len(res.Claimed), err)
	}
	wantHolders(t, r.coll, map[string]holder{"e1": {Status: events.StatusNew}, "e2": {Status: events.StatusNew}, "e3": {Status: events.StatusNew}})
	lb := fenceLease("b", 1)
	res, err = r.b.ClaimRead(ctx, lb, docsB, fenceLimit(r.p, 2))
	if err != nil || len(res.Claimed) != 3 {
		t.Fatalf("b's write = %d claimed, %v; want 3", len(res.Claimed), err)
	}
	held := holder{Status: events.StatusProcessing, Token: lb.Token}
	wantHolders(t, r.coll, map[string]holder{"e1": held, "e2": held, "e3": held})
}

// a reads three events under tenure 1; b takes p and claims the first
// only. a's write aborts: it cannot claim e2 and e3 beside b's e1, the
// inversion a clock-only fence allows when the clocks are wrong. a's next
// read leaves p out without a command, and b claims the rest.
func staleWriteAfterClaim(t *testing.T, r fenceRig) {
	ctx := t.Context()
	docsA := aReadsThree(t, r)
	lb := fenceLease("b", 1)
	limitB := fenceLimit(r.p, 2)
	limitB.Events = 1
	res, err := r.b.Claim(ctx, lb, limitB)
	if err != nil || len(res.Claimed) != 1 || res.Claimed[0].ID != "e1" {
		t.Fatalf("b's claim of one event = %v, %v; want e1", res.Claimed, err)
	}
	if _, err := r.a.ClaimRead(ctx, fenceLease("a", 1), docsA, fenceLimit(r.p, 1)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("a's write after b's claim = %v, want ErrFenced", err)
	}
	wantHolders(t, r.coll, map[string]holder{
		"e1": {Status: events.StatusProcessing, Token: lb.Token},
		"e2": {Status: events.StatusNew}, "e3": {Status: events.StatusNew},
	})
	if docs, _, err := r.a.ReadClaimable(ctx, time.Now(), fenceLimit(r.p, 1)); err != nil || len(docs) != 0 {
		t.Errorf("a's next read under tenure 1 = %d events, %v; want p left out", len(docs), err)
	}
	if n, err := r.b.MarkPublished(ctx, lb, []any{"e1"}, time.Now()); err != nil || n != 1 {
		t.Fatalf("b marks e1 published: %d, %v", n, err)
	}
	lb2 := fenceLease("b", 2)
	if res, err = r.b.Claim(ctx, lb2, fenceLimit(r.p, 2)); err != nil || len(res.Claimed) != 2 {
		t.Fatalf("b's next claim = %d events, %v; want e2 and e3", len(res.Claimed), err)
	}
}

// a claims e1 under tenure 1 before b takes p: the write commits, and b's
// first read (after raising the fence) sees it, so b claims nothing of
// e1's aggregate while e1 is in flight, only another aggregate of p. a
// still settles e1 (its lease fences that), and its next claim under
// tenure 1 aborts. b then claims e2 and e3.
func staleWriteFirst(t *testing.T, r fenceRig) {
	ctx := t.Context()
	agg, other := r.aggregates[0], r.aggregates[1]
	insert(t, r.coll, aggregateEvent("e1", agg, 1), aggregateEvent("e2", agg, 2), aggregateEvent("e3", agg, 3),
		aggregateEvent("f1", other, 4))
	la := fenceLease("a", 1)
	limitA := fenceLimit(r.p, 1)
	limitA.Events = 1
	docsA, _, err := r.a.ReadClaimable(ctx, time.Now(), limitA)
	if err != nil || len(docsA) != 1 {
		t.Fatalf("a's read of one event = %d, %v", len(docsA), err)
	}
	if res, err := r.a.ClaimRead(ctx, la, docsA, limitA); err != nil || len(res.Claimed) != 1 || res.Claimed[0].ID != "e1" {
		t.Fatalf("a's write before the takeover = %v, %v; want e1", res.Claimed, err)
	}
	lb := fenceLease("b", 1)
	res, err := r.b.Claim(ctx, lb, fenceLimit(r.p, 2))
	if err != nil {
		t.Fatalf("b's first claim: %v", err)
	}
	if got := ids(res.Claimed); !slices.Equal(got, []string{"f1"}) {
		t.Fatalf("b's first claim = %v, want f1 alone: e1 is a's, in flight, and holds its aggregate", got)
	}
	if n, err := r.a.MarkPublished(ctx, la, []any{"e1"}, time.Now()); err != nil || n != 1 {
		t.Fatalf("a settles the claim it made before the takeover: %d, %v; want 1", n, err)
	}
	docsA, _, err = r.a.ReadClaimable(ctx, time.Now(), fenceLimit(r.p, 1))
	if err != nil || len(docsA) != 2 {
		t.Fatalf("a's next read under tenure 1 = %d events, %v; want e2 and e3 (a raised the fence under 1 before)", len(docsA), err)
	}
	if _, err := r.a.ClaimRead(ctx, fenceLease("a", 2), docsA, fenceLimit(r.p, 1)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("a's next write under tenure 1 = %v, want ErrFenced", err)
	}
	lb2 := fenceLease("b", 2)
	if res, err = r.b.Claim(ctx, lb2, fenceLimit(r.p, 2)); err != nil || len(res.Claimed) != 2 {
		t.Fatalf("b's next claim = %d events, %v; want e2 and e3", len(res.Claimed), err)
	}
	held := holder{Status: events.StatusProcessing, Token: lb2.Token}
	// A mark keeps the claim token: e1 stays a's, PUBLISHED.
	wantHolders(t, r.coll, map[string]holder{"e1": {Status: events.StatusPublished, Token: la.Token}, "e2": held, "e3": held})
}

// a's write and b's first read under a new tenure run at the same moment,
// round after round: either a's claim is refused, or it committed before
// b's read, which then sees a's events PROCESSING and reads none of their
// aggregate. Never both a committed claim and b's read of its events as
// NEW. Each round is a new aggregate of p and a new pair of tenures.
func claimRacingTakeover(t *testing.T, r fenceRig) {
	ctx := t.Context()
	var committed, fenced int
	for round := range len(r.aggregates) {
		agg := r.aggregates[round]
		ta, tb := int64(2*round+1), int64(2*round+2)
		ids := []string{fmt.Sprintf("r%d-1", round), fmt.Sprintf("r%d-2", round)}
		insert(t, r.coll, aggregateEvent(ids[0], agg, 2*round), aggregateEvent(ids[1], agg, 2*round+1))
		docsA, _, err := r.a.ReadClaimable(ctx, time.Now(), fenceLimit(r.p, ta))
		if err != nil || len(ofAggregate(docsA, agg)) != 2 {
			t.Fatalf("round %d: a's read = %d events of %s, %v; want 2", round, len(ofAggregate(docsA, agg)), agg, err)
		}
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			resA  events.ClaimResult
			errA  error
			docsB []bson.Raw
			errB  error
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			resA, errA = r.a.ClaimRead(ctx, fenceLease("a", round), docsA, fenceLimit(r.p, ta))
		}()
		go func() {
			defer wg.Done()
			<-start
			docsB, _, errB = r.b.ReadClaimable(ctx, time.Now(), fenceLimit(r.p, tb))
		}()
		close(start)
		wg.Wait()
		if errB != nil {
			t.Fatalf("round %d: b's read: %v", round, errB)
		}
		seen := len(ofAggregate(docsB, agg))
		switch {
		case errA == nil:
			committed++
			if len(resA.Claimed) != 2 || seen != 0 {
				t.Fatalf("round %d: a claimed %d events and b then read %d of them as claimable: a stale claim beside the new owner's read",
					round, len(resA.Claimed), seen)
			}
		case errors.Is(errA, events.ErrFenced):
			fenced++
			if seen != 2 {
				t.Fatalf("round %d: a's claim was refused and b read %d of its 2 events, want both (NEW)", round, seen)
			}
		default:
			t.Fatalf("round %d: a's write: %v", round, errA)
		}
		if _, err := r.b.ClaimRead(ctx, fenceLease("b", round), docsB, fenceLimit(r.p, tb)); err != nil {
			t.Fatalf("round %d: b's write: %v", round, err)
		}
	}
	t.Logf("%d rounds: a's claim committed before the takeover in %d, refused in %d", len(r.aggregates), committed, fenced)
}

// ofAggregate returns the documents of aggregate agg.
func ofAggregate(docs []bson.Raw, agg string) []bson.Raw {
	var out []bson.Raw
	for _, d := range docs {
		if v, ok := d.Lookup(events.FieldAggregateID).StringValueOK(); ok && v == agg {
			out = append(out, d)
		}
	}
	return out
}
