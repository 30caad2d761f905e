package claim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/metrics"
)

// readStore is a Store whose read answers err, or nothing; reads counts
// the reads.
type readStore struct {
	Store
	err   error
	reads int
}

func (s *readStore) ReadClaimable(context.Context, time.Time, events.ClaimLimit) ([]bson.Raw, bool, error) {
	s.reads++
	return nil, false, s.err
}

// notReadyPublisher is a Publisher whose broker cannot take a publish.
type notReadyPublisher struct{ idlePublisher }

func (notReadyPublisher) Ready() error { return events.ErrUnavailable }

// Every claim run is counted by its outcome, so that a relay whose
// replicas own no partition, or whose claims all fail, shows in the
// metrics: a claim without partitions reads nothing and is "unowned", not
// "idle".
func TestClaimRunsCountedByOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		owned     int64 // the term of every partition; 0: none owned
		readErr   error
		pub       Publisher
		want      string
		wantReads int
		wantErr   bool
	}{
		{name: "no partition owned", owned: 0, want: metrics.ClaimUnowned},
		{name: "nothing claimable", owned: 1, want: metrics.ClaimIdle, wantReads: 1},
		{name: "the read fails", owned: 1, readErr: errors.New("not authorized on outbox to execute command { find: \"events\" }"), want: metrics.ClaimError, wantReads: 1, wantErr: true},
		{name: "broker not ready", owned: 1, pub: notReadyPublisher{}, want: metrics.ClaimPaused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &readStore{err: tc.readErr}
			pub := tc.pub
			if pub == nil {
				pub = idlePublisher{t}
			}
			owner := &scriptedOwner{answers: []ownerAnswer{{terms: allTerms(tc.owned), validFor: time.Minute}}}
			c, m := newClaimer(t, store, pub, Config{Owner: owner})
			if _, err := c.runOnce(t.Context()); (err != nil) != tc.wantErr {
				t.Fatalf("runOnce = %v, want an error: %t", err, tc.wantErr)
			}
			if store.reads != tc.wantReads {
				t.Errorf("reads of the outbox = %d, want %d", store.reads, tc.wantReads)
			}
			for _, r := range metrics.ClaimOutcomes {
				want := 0.0
				if r == tc.want {
					want = 1
				}
				if got := testutil.ToFloat64(m.ClaimRuns.WithLabelValues(r)); got != want {
					t.Errorf("claim_runs_total{result=%q} = %v, want %v", r, got, want)
				}
			}
			wantErrs := map[bool]float64{true: 1}[tc.wantErr]
			if got := testutil.ToFloat64(m.JobErrors.WithLabelValues("claim")); got != wantErrs {
				t.Errorf("job_errors_total{job=claim} = %v, want %v", got, wantErrs)
			}
		})
	}
}
