package claim

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/metrics"
)

// planNow has sub-millisecond digits: retry times are stored as BSON dates
// and must come out of plan truncated to milliseconds.
var planNow = time.Date(2025, 6, 7, 8, 9, 10, 123456789, time.UTC)

func at(d time.Duration) time.Time { return planNow.Add(d).Truncate(time.Millisecond) }

func TestPlan(t *testing.T) {
	t.Parallel()
	poison := &events.InvalidError{Field: "type", Reason: "is missing"}
	wrappedPoison := fmt.Errorf("build message: %w", &events.InvalidError{Field: "payload", Reason: "must be a document, got string"})
	unavailable := fmt.Errorf("%w: not connected", events.ErrUnavailable)
	unconfirmed := fmt.Errorf("%w: context deadline exceeded", events.ErrUnconfirmed)
	returned := fmt.Errorf("%w: 312 NO_ROUTE (routing key %q)", events.ErrReturned, "order.created")
	other := errors.New("something else")
	rejected := fmt.Errorf("%w: channel closed by the broker: 406 PRECONDITION_FAILED - invalid message: "+
		"{unacceptable_type_in_header,\"CC\",longstr} (published alone 2 times)", events.ErrRejected)

	tests := []struct {
		name          string
		outcomes      []outcome
		wantPublished []any
		wantReleases  []release
	}{
		{
			name:          "confirmed events are published",
			outcomes:      []outcome{{id: "a", attempts: 1}, {id: "b", attempts: 4}},
			wantPublished: []any{"a", "b"},
		},
		{
			name:         "poison fails at once on its first attempt",
			outcomes:     []outcome{{id: "a", attempts: 1, err: poison}},
			wantReleases: []release{failedRelease(metrics.ReasonInvalid, poison.Error(), "a")},
		},
		{
			name:         "poison past max attempts still fails as invalid",
			outcomes:     []outcome{{id: "a", attempts: 9, err: poison}},
			wantReleases: []release{failedRelease(metrics.ReasonInvalid, poison.Error(), "a")},
		},
		{
			name:         "wrapped poison is poison",
			outcomes:     []outcome{{id: "a", attempts: 1, err: wrappedPoison}},
			wantReleases: []release{failedRelease(metrics.ReasonInvalid, wrappedPoison.Error(), "a")},
		},
		{
			name:         "rejected by the broker fails at once with the broker's reason",
			outcomes:     []outcome{{id: "a", attempts: 1, err: rejected}, {id: "b", attempts: 2, err: rejected}},
			wantReleases: []release{failedRelease(metrics.ReasonRejected, rejected.Error(), "a", "b")},
		},
		{
			name:         "broker unavailable refunds without a retry time",
			outcomes:     []outcome{{id: "a", attempts: 1, err: unavailable}, {id: "b", attempts: 2, err: unavailable}},
			wantReleases: []release{refundRelease(metrics.ReasonBrokerUnavailable, unavailable.Error(), "a", "b")},
		},
		{
			name:         "broker unavailable on the last attempt is not the event's fault",
			outcomes:     []outcome{{id: "a", attempts: 3, err: unavailable}},
			wantReleases: []release{refundRelease(metrics.ReasonBrokerUnavailable, unavailable.Error(), "a")},
		},
		{
			name:         "unconfirmed refunds without a retry time",
			outcomes:     []outcome{{id: "a", attempts: 3, err: unconfirmed}},
			wantReleases: []release{refundRelease(metrics.ReasonUnconfirmed, unconfirmed.Error(), "a")},
		},
		{
			name:         "nack retries after the first backoff",
			outcomes:     []outcome{{id: "a", attempts: 1, err: events.ErrNacked}},
			wantReleases: []release{retryRelease(metrics.ReasonNacked, events.ErrNacked.Error(), at(time.Second), "a")},
		},
		{
			name:         "return retries with backoff doubled per attempt",
			outcomes:     []outcome{{id: "a", attempts: 2, err: returned}},
			wantReleases: []release{retryRelease(metrics.ReasonReturned, returned.Error(), at(2*time.Second), "a")},
		},
		{
			name:         "any other error retries as error",
			outcomes:     []outcome{{id: "a", attempts: 1, err: other}},
			wantReleases: []release{retryRelease(metrics.ReasonError, other.Error(), at(time.Second), "a")},
		},
		{
			name: "same attempt count shares one release",
			outcomes: []outcome{
				{id: "a", attempts: 1, err: events.ErrNacked},
				{id: "b", attempts: 2, err: events.ErrNacked},
				{id: "c", attempts: 1, err: events.ErrNacked},
				{id: "d", attempts: 2, err: events.ErrNacked},
			},
			wantReleases: []release{
				retryRelease(metrics.ReasonNacked, events.ErrNacked.Error(), at(time.Second), "a", "c"),
				retryRelease(metrics.ReasonNacked, events.ErrNacked.Error(), at(2*time.Second), "b", "d"),
			},
		},
		{
			name:         "max attempts fails with the last error kept",
			outcomes:     []outcome{{id: "a", attempts: 3, err: events.ErrNacked}},
			wantReleases: []release{failedRelease(metrics.ReasonMaxAttempts, "gave up after 3 attempts: "+events.ErrNacked.Error(), "a")},
		},
		{
			name:         "past max attempts fails too",
			outcomes:     []outcome{{id: "a", attempts: 5, err: returned}},
			wantReleases: []release{failedRelease(metrics.ReasonMaxAttempts, "gave up after 5 attempts: "+returned.Error(), "a")},
		},
		{
			name: "a mixed batch: one write per kind of outcome, in order of first appearance",
			outcomes: []outcome{
				{id: "ok1", attempts: 1},
				{id: "poison", attempts: 1, err: poison},
				{id: "nack1", attempts: 1, err: events.ErrNacked},
				{id: "down", attempts: 2, err: unavailable},
				{id: "ok2", attempts: 2},
				{id: "spent", attempts: 3, err: events.ErrNacked},
				{id: "nack2", attempts: 1, err: events.ErrNacked},
			},
			wantPublished: []any{"ok1", "ok2"},
			wantReleases: []release{
				failedRelease(metrics.ReasonInvalid, poison.Error(), "poison"),
				retryRelease(metrics.ReasonNacked, events.ErrNacked.Error(), at(time.Second), "nack1", "nack2"),
				refundRelease(metrics.ReasonBrokerUnavailable, unavailable.Error(), "down"),
				failedRelease(metrics.ReasonMaxAttempts, "gave up after 3 attempts: "+events.ErrNacked.Error(), "spent"),
			},
		},
		{
			name: "nothing to do",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := policy{workerID: planWorker, maxAttempts: 3, retryMin: time.Second, retryMax: time.Minute, jitter: noJitter}
			published, releases := p.plan(tt.outcomes, planNow)
			if diff := cmp.Diff(tt.wantPublished, published, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("published (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantReleases, releases, cmp.AllowUnexported(release{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("releases (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPlanJitterOncePerAttemptCount checks that a batch that failed together
// draws one retry time per attempt count, so random jitter cannot split one
// attempt count into as many writes as it has events.
func TestPlanJitterOncePerAttemptCount(t *testing.T) {
	t.Parallel()
	calls := 0
	jitter := func(d time.Duration) time.Duration {
		calls++
		return d - time.Duration(calls)*time.Millisecond // a different draw every call
	}
	p := policy{maxAttempts: 10, retryMin: time.Second, retryMax: time.Minute, jitter: jitter}
	var outcomes []outcome
	for i := range 100 {
		outcomes = append(outcomes, outcome{id: i, attempts: 1 + i%2, err: events.ErrNacked})
	}
	_, releases := p.plan(outcomes, planNow)

	type group struct {
		Events  int
		RetryAt time.Time
	}
	var got []group
	for _, r := range releases {
		got = append(got, group{len(r.IDs), r.RetryAt})
	}
	want := []group{
		{50, at(time.Second - time.Millisecond)},     // attempts 1: first draw
		{50, at(2*time.Second - 2*time.Millisecond)}, // attempts 2: second draw
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("release groups (-want +got):\n%s", diff)
	}
	if calls != 2 {
		t.Errorf("jitter drawn %d times for two attempt counts, want 2", calls)
	}
}

// failedRelease, refundRelease and retryRelease are the writes plan makes:
// events to FAILED, back to NEW with their attempt refunded, and back to
// NEW to be retried at retryAt; each counted under reason.
// planWorker is the worker id of the policy under test, on the attempts
// its releases record.
const planWorker = "w1"

// attempt is the failed attempt a release that counted it records.
func attempt(reason, lastError string) *events.AttemptError {
	return &events.AttemptError{At: planNow.Truncate(time.Millisecond), WorkerID: planWorker, Reason: reason, Error: lastError}
}

func failedRelease(reason, lastError string, ids ...any) release {
	return release{events.Release{IDs: ids, Status: events.StatusFailed, LastError: lastError, Attempt: attempt(reason, lastError)}, reason}
}

func refundRelease(reason, lastError string, ids ...any) release {
	return release{events.Release{IDs: ids, Status: events.StatusNew, LastError: lastError, Refund: true}, reason}
}

func retryRelease(reason, lastError string, retryAt time.Time, ids ...any) release {
	return release{events.Release{IDs: ids, Status: events.StatusNew, LastError: lastError, RetryAt: retryAt, Attempt: attempt(reason, lastError)}, reason}
}

// noJitter keeps every delay at its full length.
func noJitter(d time.Duration) time.Duration { return d }

// fullJitter shortens a delay the most backoff.Jitter may: to half.
func fullJitter(d time.Duration) time.Duration { return d / 2 }

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		n      int
		lo, hi time.Duration
		jitter func(time.Duration) time.Duration
		want   time.Duration
	}{
		{"first retry waits min", 1, time.Second, 5 * time.Minute, noJitter, time.Second},
		{"second doubles", 2, time.Second, 5 * time.Minute, noJitter, 2 * time.Second},
		{"third doubles again", 3, time.Second, 5 * time.Minute, noJitter, 4 * time.Second},
		{"ninth below the cap", 9, time.Second, 5 * time.Minute, noJitter, 256 * time.Second},
		{"tenth capped at max", 10, time.Second, 5 * time.Minute, noJitter, 5 * time.Minute},
		{"far past the cap stays at max", 1000, time.Second, 5 * time.Minute, noJitter, 5 * time.Minute},
		{"zero attempts waits min", 0, time.Second, 5 * time.Minute, noJitter, time.Second},
		{"min equals max", 7, 3 * time.Second, 3 * time.Second, noJitter, 3 * time.Second},
		{"full jitter halves the first", 1, time.Second, 5 * time.Minute, fullJitter, 500 * time.Millisecond},
		{"full jitter halves the cap", 20, time.Second, 5 * time.Minute, fullJitter, 150 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := policy{retryMin: tt.lo, retryMax: tt.hi, jitter: tt.jitter}
			if diff := cmp.Diff(tt.want, p.retryDelay(tt.n)); diff != "" {
				t.Errorf("retryDelay(%d) with %s..%s (-want +got):\n%s", tt.n, tt.lo, tt.hi, diff)
			}
		})
	}
}

// TestRetryDelayJitterGetsTheCappedDelay checks what jitter is asked to
// spread: the capped delay, not the uncapped one.
func TestRetryDelayJitterGetsTheCappedDelay(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	p := policy{retryMin: time.Second, retryMax: time.Minute, jitter: func(d time.Duration) time.Duration {
		got = append(got, d)
		return d
	}}
	for _, n := range []int{1, 3, 30} {
		p.retryDelay(n)
	}
	want := []time.Duration{time.Second, 4 * time.Second, time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("jitter arguments (-want +got):\n%s", diff)
	}
}

// TestRetryDelayRandomJitterBounds checks the production jitter: every delay
// lies in [half, whole] of the un-jittered delay, and varies.
func TestRetryDelayRandomJitterBounds(t *testing.T) {
	t.Parallel()
	exact := policy{retryMin: time.Second, retryMax: 5 * time.Minute, jitter: noJitter}
	random := policy{retryMin: time.Second, retryMax: 5 * time.Minute, jitter: backoff.Jitter}
	for n := 1; n <= 12; n++ {
		full := exact.retryDelay(n)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := random.retryDelay(n)
			if d < full/2 || d > full {
				t.Fatalf("retryDelay(%d) = %s with random jitter, want within [%s, %s]", n, d, full/2, full)
			}
			seen[d] = true
		}
		// 200 draws from a range of at least 500ms in nanoseconds: a jitter
		// that always returned the same value would be no jitter at all.
		if len(seen) < 2 {
			t.Errorf("retryDelay(%d) with random jitter returned one value 200 times: %v", n, seen)
		}
	}
}
