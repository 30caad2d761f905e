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

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
)

// fencedStore is a Store whose read or write answers ErrFenced, as the
// mongo store does when the database's fence refuses the claim. It
// records the tenures each call was given and the leases abandoned.
type fencedStore struct {
	Store
	t          *testing.T
	readFenced bool
	reads      [][]int64
	writes     [][]int64
	abandoned  []events.Lease
}

func (s *fencedStore) ReadClaimable(_ context.Context, _ time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	s.reads = append(s.reads, slices.Clone(limit.Tenures))
	if s.readFenced {
		return nil, false, &events.FencedError{Fences: map[int]int64{3: 9}}
	}
	doc, err := bson.Marshal(bson.D{{Key: "_id", Value: "e-1"}, {Key: "type", Value: "t"}, {Key: "payload", Value: bson.D{}},
		{Key: "status", Value: "NEW"}, {Key: "createdAt", Value: time.Now()}})
	if err != nil {
		s.t.Fatal(err)
	}
	return []bson.Raw{doc}, false, nil
}

func (s *fencedStore) ClaimRead(_ context.Context, _ events.Lease, _ []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	s.writes = append(s.writes, slices.Clone(limit.Tenures))
	return events.ClaimResult{}, fmt.Errorf("claim 1 events: %w", &events.FencedError{Fences: map[int]int64{3: 9}})
}

func (s *fencedStore) Abandon(_ context.Context, lease events.Lease) (int, error) {
	s.abandoned = append(s.abandoned, lease)
	return 0, nil
}

// A claim the database's fence refuses, at its read or at its write, is a
// partition lost and not a failure: nothing is published (idlePublisher
// fails the test on a publish), the run counts as unowned and in
// claim_fenced_total, not as an error, and a refused write's lease is put
// back in case an earlier part of it was written. The store gets the
// tenures Hold returned, read and write alike.
func TestClaimFencedByTheDatabase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		readFenced    bool
		wantWrites    int
		wantAbandoned int
	}{
		{name: "at the read", readFenced: true},
		{name: "at the write", wantWrites: 1, wantAbandoned: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &fencedStore{t: t, readFenced: tc.readFenced}
			owner := &scriptedOwner{answers: []ownerAnswer{{terms: allTerms(4), validFor: time.Minute}}}
			c, m := newClaimer(t, store, idlePublisher{t}, Config{Owner: owner})
			more, err := c.runOnce(t.Context())
			if err != nil || more {
				t.Fatalf("runOnce = %t, %v; want false, nil", more, err)
			}
			if got := testutil.ToFloat64(m.ClaimFenced); got != 1 {
				t.Errorf("claim_fenced_total = %v, want 1", got)
			}
			for _, r := range metrics.ClaimOutcomes {
				want := map[bool]float64{true: 1}[r == metrics.ClaimUnowned]
				if got := testutil.ToFloat64(m.ClaimRuns.WithLabelValues(r)); got != want {
					t.Errorf("claim_runs_total{result=%q} = %v, want %v", r, got, want)
				}
			}
			if got := testutil.ToFloat64(m.JobErrors.WithLabelValues("claim")); got != 0 {
				t.Errorf("job_errors_total{job=claim} = %v, want 0", got)
			}
			if len(store.writes) != tc.wantWrites || len(store.abandoned) != tc.wantAbandoned {
				t.Errorf("writes %d, leases abandoned %d; want %d and %d", len(store.writes), len(store.abandoned), tc.wantWrites, tc.wantAbandoned)
			}
			// The ownership is told, so that it drops partition 3 and
			// takes it again above the fence.
			var told *events.FencedError
			for _, w := range owner.wrote {
				if f := (*events.FencedError)(nil); errors.As(w.err, &f) {
					told = f
				}
			}
			if told == nil || told.Fences[3] != 9 {
				t.Errorf("the owner was told %v, want the fence's refusal of partition 3 at tenure 9", owner.wrote)
			}
			want := make([]int64, events.Partitions)
			for p := range want {
				want[p] = 4
			}
			for _, got := range append(store.reads, store.writes...) {
				if !slices.Equal(got, want) {
					t.Errorf("the store got tenures %v, want Hold's %v", got, want)
				}
			}
		})
	}
}
