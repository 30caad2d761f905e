package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// scriptedOwner answers Hold with the next of its answers (the last one
// over again), counting the calls.
type scriptedOwner struct {
	answers []ownerAnswer
	calls   int
	renews  int
	wrote   []wrote
}

type ownerAnswer struct {
	terms    func(p int) int64
	validFor time.Duration
}

func (o *scriptedOwner) Hold() ([]int64, time.Duration, func()) {
	a := o.answers[min(o.calls, len(o.answers)-1)]
	o.calls++
	terms := make([]int64, events.Partitions)
	for p := range terms {
		terms[p] = a.terms(p)
	}
	return terms, a.validFor, func() {}
}

// Renew counts the renewals; the answers script what Hold sees after them.
func (o *scriptedOwner) Renew(context.Context) error {
	o.renews++
	return nil
}

// Wrote records what the claims reported.
func (o *scriptedOwner) Wrote(partitions []int, _ time.Duration, err error) {
	o.wrote = append(o.wrote, wrote{partitions: partitions, err: err})
}

type wrote struct {
	partitions []int
	err        error
}

func allTerms(term int64) func(int) int64 { return func(int) int64 { return term } }

// ownerValidFor is an owner of every partition at term 1 whose Holds find the
// validities in turn, the last one over again.
func ownerValidFor(validities ...time.Duration) *scriptedOwner {
	o := &scriptedOwner{}
	for _, v := range validities {
		o.answers = append(o.answers, ownerAnswer{terms: allTerms(1), validFor: v})
	}
	return o
}

// fencedClaimer is a claimer of batches of n under owner's fence, over a
// fresh store of n events interleaved over aggregates aggregates.
func fencedClaimer(t *testing.T, owner Owner, n, aggregates int) (*Claimer, *metrics.Metrics, *driver.Collection) {
	t.Helper()
	store := mongotest.Store(t)
	insertInterleaved(t, store.Collection(), n, aggregates)
	c, m := newClaimer(t, store, idlePublisher{t}, Config{Owner: owner, Ordering: OrderingAggregate, BatchSize: n})
	return c, m, store.Collection()
}

// A claim reads in the partitions owned when it starts and writes under
// the fence: only the events of partitions owned since then under the
// same term, within the validity the fence finds, with the lease's time
// of the write. The reads are not cut off by the validity at the start,
// which a slow read (FerretDB decoding large documents) outlasted.
func TestClaimWritesUnderTheFence(t *testing.T) {
	t.Parallel()
	const n = 40
	cases := []struct {
		name string
		// fence is the ownership the fence finds, given the partition of
		// one event the test watches.
		fence func(watched int) func(p int) int64
		// watchedClaimed says whether the watched partition's events are
		// claimed; every other event always is.
		watchedClaimed bool
	}{
		{"unchanged", func(int) func(int) int64 { return allTerms(1) }, true},
		{"changed hands during the read", func(w int) func(int) int64 {
			return func(p int) int64 { return map[bool]int64{true: 2, false: 1}[p == w] }
		}, false},
		{"lost during the read", func(w int) func(int) int64 {
			return func(p int) int64 { return map[bool]int64{true: 0, false: 1}[p == w] }
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := mongotest.Store(t)
			want := insertInterleaved(t, store.Collection(), n, 8)
			watched := events.PartitionOf(events.Key("order", "agg-3"))
			partition := partitionsOf(t, store.Collection())
			owner := &scriptedOwner{answers: []ownerAnswer{
				{terms: allTerms(1), validFor: time.Nanosecond}, // about to run out as the claim starts
				{terms: tc.fence(watched), validFor: time.Minute},
			}}
			c, _ := newClaimer(t, store, idlePublisher{t}, Config{Owner: owner, Ordering: OrderingAggregate, BatchSize: n})
			start := time.Now().Truncate(time.Millisecond)
			res, lease := claimAsA(t, c)
			if owner.calls != 2 {
				t.Errorf("Hold called %d times, want 2: once before the reads, once to fence the writes", owner.calls)
			}
			if lease.At.Before(start) {
				t.Errorf("lease time of the writes %s, want the time of the writes (after %s)", lease.At, start)
			}
			claimed := map[string]bool{}
			for _, e := range res.Claimed {
				claimed[testenv.MessageID(e.ID)] = true
			}
			stored := allEvents(t, store.Collection())
			for _, e := range want {
				inWatched := partition[e.id] == watched
				if got, wantClaimed := claimed[e.id], !inWatched || tc.watchedClaimed; got != wantClaimed {
					t.Errorf("event %s (aggregate %q, partition %d) claimed %t, want %t", e.id, e.aggregate, partition[e.id], got, wantClaimed)
				}
				if claimed[e.id] && !stored[e.id].ProcessingAt.Equal(lease.At) {
					t.Errorf("event %s processingAt %s, want the fence's %s", e.id, stored[e.id].ProcessingAt, lease.At)
				}
			}
		})
	}
}

// partitionsOf returns the partition of every stored event by message id.
func partitionsOf(t *testing.T, coll *driver.Collection) map[string]int {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatalf("find events: %v", err)
	}
	defer cur.Close(t.Context())
	out := map[string]int{}
	for cur.Next(t.Context()) {
		out[cur.Current.Lookup(events.FieldID).ObjectID().Hex()] = events.Partition(cur.Current)
	}
	return out
}

// A claim does not start a write its partitions' validity cannot cover,
// by the write times it has seen: it renews first, and writes the whole
// batch under the renewed terms. Where even a renewal leaves too little,
// it writes what fits, and at least one event, and leaves the rest NEW.
func TestFenceGivesTheWriteTheTimeItNeeds(t *testing.T) {
	t.Parallel()
	const n = 40
	cases := []struct {
		name       string
		afterRenew time.Duration // the validity Hold finds after a renewal
		seen       []writeTime   // the writes seen before
		want       int           // events claimed
	}{
		{"renewed in time", time.Minute, []writeTime{{n, time.Second}}, n},
		// About 360 ms a round trip and 41 ms an event: 30 events fit in
		// 2 s less a fifth, the headroom of two writes that keep to the
		// estimate (writeSpreadMargin). (The validities leave a real
		// write on a busy host the time it takes.)
		{"renewal short: what fits", 2 * time.Second, []writeTime{{1, 400 * time.Millisecond}, {n, 2 * time.Second}}, 30},
		{"renewal too short: one event", 2 * time.Second, []writeTime{{n, 10 * time.Second}}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A minute before the read; then a renewal is near.
			owner := ownerValidFor(time.Minute, 500*time.Millisecond, tc.afterRenew)
			c, m, coll := fencedClaimer(t, owner, n, 8)
			for _, w := range tc.seen {
				c.writes.observe(w.events, w.took)
			}
			res, _ := claimAsA(t, c)
			if owner.renews != 1 {
				t.Errorf("renewals before the write = %d, want 1", owner.renews)
			}
			if len(res.Claimed) != tc.want {
				t.Errorf("claimed %d events, want %d", len(res.Claimed), tc.want)
			}
			if got := testutil.ToFloat64(m.ClaimTrimmed); got != float64(n-tc.want) {
				t.Errorf("claim_trimmed_events_total = %v, want %d", got, n-tc.want)
			}
			if processing := inStatus(t, coll, events.StatusProcessing); processing != tc.want {
				t.Errorf("%d events PROCESSING, want %d: the rest stay NEW", processing, tc.want)
			}
		})
	}
}

// A renewal beside the read is timed to end with it, from the reads and
// renewals measured lately: one expected to take as long as the read
// starts with it, and one the read would outlast by far waits, and is
// left out when the read ends first (the fence renews then if the write
// needs it). Started at once, it ended long before a slow read, and the
// read's time came off the renewed validity.
func TestRenewalBesideTheReadEndsWithIt(t *testing.T) {
	t.Parallel()
	const n = 20
	cases := []struct {
		name        string
		read, renew time.Duration // measured before
		wantRenews  int
	}{
		{"a renewal as long as the read starts with it", time.Millisecond, time.Hour, 1},
		{"a read far longer than a renewal: left out when it ends first", time.Hour, time.Millisecond, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Short of the read and the write, then a minute.
			owner := ownerValidFor(time.Nanosecond, time.Minute)
			c, _, _ := fencedClaimer(t, owner, n, 4)
			c.reads.observe(tc.read)
			c.renews.observe(tc.renew)
			res, _ := claimAsA(t, c)
			if owner.renews != tc.wantRenews {
				t.Errorf("renewals = %d, want %d", owner.renews, tc.wantRenews)
			}
			if len(res.Claimed) != n {
				t.Errorf("claimed %d events, want %d", len(res.Claimed), n)
			}
		})
	}
}

// claimAsA runs one claim of c as worker-a and returns what it claimed and
// the lease it wrote, which the claim dates.
func claimAsA(t *testing.T, c *Claimer) (events.ClaimResult, events.Lease) {
	t.Helper()
	lease := events.Lease{WorkerID: "worker-a", Token: "t"}
	res, _, err := c.claim(t.Context(), &lease)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return res, lease
}

// The first claim after a start has timed no read and no renewal of its
// own: it estimates both from the database's round trip
// (Config.RoundTrip), so that it renews beside its read as later claims
// do. Without the estimate it renewed only in its write's path, and
// through a slow link that renewal was seconds of every start.
func TestFirstClaimRenewsBesideItsRead(t *testing.T) {
	t.Parallel()
	const n = 20
	// Short of the read and the write, then a minute.
	owner := &signallingOwner{scriptedOwner: ownerValidFor(5*time.Millisecond, time.Minute), renewed: make(chan struct{})}
	c, _, _ := fencedClaimer(t, owner, n, 4)
	c.cfg.RoundTrip = func() time.Duration { return time.Millisecond }
	// The read lasts until the partitions are renewed: only a renewal
	// beside it ends it.
	c.store = readAfter{Store: c.store, renewed: owner.renewed}
	res, _ := claimAsA(t, c)
	if owner.renews != 1 {
		t.Errorf("renewals = %d, want 1, beside the read", owner.renews)
	}
	if len(res.Claimed) != n {
		t.Errorf("claimed %d events, want %d", len(res.Claimed), n)
	}
}

// Before any write, a renewal beside the read serves the write: the need
// of a first write (twice the read) is there to make the partitions be
// renewed first, so the fence does not renew again once the validity
// covers the read itself. Without such a renewal it renews.
func TestRenewalBesideTheReadServesTheFirstWrite(t *testing.T) {
	t.Parallel()
	const n = 20
	for _, renewedBeside := range []bool{true, false} {
		t.Run(fmt.Sprintf("renewed beside %t", renewedBeside), func(t *testing.T) {
			t.Parallel()
			// Between one read and the two a first write is given.
			owner := ownerValidFor(1500 * time.Millisecond)
			c, _, coll := fencedClaimer(t, owner, n, 4)
			c.reads.observe(time.Second)
			docs, _, _, done := c.fence(t.Context(), allOwned(), rawDocuments(t, coll), renewedBeside)
			done()
			wantRenews := map[bool]int{true: 0, false: 1}[renewedBeside]
			if owner.renews != wantRenews {
				t.Errorf("renewals = %d, want %d", owner.renews, wantRenews)
			}
			if len(docs) != n {
				t.Errorf("kept %d events for the write, want %d", len(docs), n)
			}
		})
	}
}

// signallingOwner is a scriptedOwner whose first renewal closes renewed.
type signallingOwner struct {
	*scriptedOwner
	renewed chan struct{}
}

func (o *signallingOwner) Renew(ctx context.Context) error {
	if o.renews == 0 {
		defer close(o.renewed)
	}
	return o.scriptedOwner.Renew(ctx)
}

// readAfter is a store whose reads wait for renewed.
type readAfter struct {
	Store
	renewed chan struct{}
}

func (s readAfter) ReadClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	select {
	case <-s.renewed:
	case <-time.After(30 * time.Second):
		return nil, false, errors.New("no renewal beside the read")
	}
	return s.Store.ReadClaimable(ctx, now, limit)
}

// allOwned is the terms of an owner of every partition at term 1.
func allOwned() []int64 {
	terms := make([]int64, events.Partitions)
	for p := range terms {
		terms[p] = 1
	}
	return terms
}

// rawDocuments returns every document of coll.
func rawDocuments(t *testing.T, coll *driver.Collection) []bson.Raw {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []bson.Raw
	for cur.Next(t.Context()) {
		docs = append(docs, slices.Clone(cur.Current))
	}
	if err := cur.Err(); err != nil {
		t.Fatal(err)
	}
	return docs
}
