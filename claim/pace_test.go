package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

func TestBatchLimitHalvesOnTimeoutAndRegrowsBySteps(t *testing.T) {
	t.Parallel()
	b := newBatchLimit(500)
	var got []int
	for range 4 {
		got = append(got, b.timedOut())
	}
	if want := []int{250, 125, 62, 31}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("limits after 4 timeouts = %v, want %v", got, want)
	}
	if n := b.succeeded(10, false); n != 31 {
		t.Errorf("limit after a claim that took 10 of 31 and stopped at a bound = %d, want 31: a short claim says nothing of a larger one", n)
	}
	if n := b.succeeded(31, false); n != 31+500/batchRegrowClaims {
		t.Errorf("limit after a full claim = %d, want one step more, %d", n, 31+500/batchRegrowClaims)
	}
	if n := b.succeeded(0, true); n != 31+2*(500/batchRegrowClaims) {
		t.Errorf("limit after a claim that found all there was = %d, want one step more, %d", n, 31+2*(500/batchRegrowClaims))
	}
	for range batchRegrowClaims + 1 {
		b.succeeded(b.get(), false)
	}
	if n := b.get(); n != 500 {
		t.Errorf("limit after %d full claims = %d, want back at the batch size 500 and no more", batchRegrowClaims+1, n)
	}
	for range 20 {
		b.timedOut()
	}
	if n := b.get(); n != 1 {
		t.Errorf("limit after 20 timeouts = %d, want 1", n)
	}
}

// The estimate keeps a write's round trip apart from its cost per event:
// writes of a few events through a slow link say nothing of a large
// write's cost per event, and must not make it look like hours.
func TestWriteTimesNeedAndFit(t *testing.T) {
	t.Parallel()
	near := func(got, want time.Duration) bool { return (got - want).Abs() <= time.Millisecond }
	var w writeTimes
	if need := w.need(500, 0); need != 0 {
		t.Errorf("need before any write or read = %s, want 0", need)
	}
	if n := w.fit(500, time.Millisecond); n != 500 {
		t.Errorf("fit before any write or read = %d, want all 500", n)
	}
	w.observe(1, 600*time.Millisecond) // a round trip of 600 ms
	if got := w.need(500, 0); !near(got, 1200*time.Millisecond) {
		t.Errorf("need(500) after one write of one event in 600ms = %s, want 1.2s: twice the round trip, no cost per event yet", got)
	}
	w.observe(1, 608*time.Millisecond)
	w.observe(201, 1404*time.Millisecond) // 4 ms an event over a round trip of 604 ms, less one event's
	// Three writes show their spread: the worst (608 ms) is 1.0066 times
	// the estimate for its size, so the headroom is 1.258 (a quarter more
	// than that), not twice.
	for _, tc := range []struct {
		events int
		want   time.Duration
	}{
		{1, 760 * time.Millisecond},
		{100, 1258 * time.Millisecond},
		{500, 3272 * time.Millisecond},
	} {
		if got := w.need(tc.events, 0); !near(got, tc.want) {
			t.Errorf("need(%d) = %s, want %s", tc.events, got, tc.want)
		}
	}
	if n := w.fit(500, 2*time.Second); n != 247 {
		t.Errorf("fit(500, 2s) = %d, want 247", n)
	}
	if n := w.fit(500, 700*time.Millisecond); n != 25 {
		t.Errorf("fit(500, 700ms) = %d, want 25: the base takes the headroom, so as many as the estimate itself fits", n)
	}
	if n := w.fit(500, 500*time.Millisecond); n != 0 {
		t.Errorf("fit(500, 500ms) = %d, want 0: not even the round trip fits", n)
	}
	// The estimate follows the database: writes seen later push the
	// slow ones out.
	for range writeTimesKept {
		w.observe(100, 10*time.Millisecond)
	}
	if got := w.need(100, 0); !near(got, 12500*time.Microsecond) {
		t.Errorf("need(100) after %d fast writes = %s, want 12.5ms: a quarter more than writes that keep to the estimate", writeTimesKept, got)
	}
}

// The headroom is twice the estimate until a few writes are seen, then
// sized from how far they strayed from it: a quarter more than the worst
// of them, never less than a quarter more, never more than twice. Through
// a distant but steady link twice the estimate made every write of a
// short term wait for one more renewal.
func TestWriteTimesHeadroomFollowsTheSpread(t *testing.T) {
	t.Parallel()
	near := func(got, want time.Duration) bool { return (got - want).Abs() <= time.Millisecond }
	var w writeTimes
	for range writeSpreadWrites - 1 {
		w.observe(500, 1400*time.Millisecond)
	}
	if got := w.need(500, 0); !near(got, 2800*time.Millisecond) {
		t.Errorf("need(500) after %d writes = %s, want 2.8s: twice, too few writes to tell their spread", writeSpreadWrites-1, got)
	}
	w.observe(500, 1400*time.Millisecond)
	if got := w.need(500, 0); !near(got, 1750*time.Millisecond) {
		t.Errorf("need(500) after %d steady writes = %s, want 1.75s: a quarter more", writeSpreadWrites, got)
	}
	for _, d := range []time.Duration{1000, 1800, 1000, 1800} {
		w.observe(500, d*time.Millisecond)
	}
	// Mean 1.4 s, worst 1.8 s: 1.25 times 1.8/1.4 of the estimate.
	if got := w.need(500, 0); !near(got, 2250*time.Millisecond) {
		t.Errorf("need(500) after writes of 1 to 1.8 s = %s, want 2.25s", got)
	}
	w.observe(500, 5*time.Second)
	base, _, _ := w.model(0)
	if got := w.need(500, 0); got != 2*base {
		t.Errorf("need(500) after a write far over the estimate = %s, want twice the estimate %s", got, base)
	}
}

// Before the first write, the read stands for it: the fence then renews
// for the first write through a slow link instead of sending it with
// what validity is left, which timed out every first claim. Once a write
// is seen, the read says nothing more.
func TestWriteTimesPriorBeforeTheFirstWrite(t *testing.T) {
	t.Parallel()
	var w writeTimes
	read := 1800 * time.Millisecond // three round trips of 600 ms
	if got := w.need(500, read); got != 2*read {
		t.Errorf("need(500) before any write, after a read of %s = %s, want %s", read, got, 2*read)
	}
	if n := w.fit(500, 3*time.Second); n != 500 {
		t.Errorf("fit(500, 3s) before any write, after a read of %s = %d, want all 500: fewer events would not fit better", read, n)
	}
	if n := w.fit(500, time.Second); n != 500 {
		t.Errorf("fit(500, 1s) before any write, after a read of %s = %d, want all 500: the read serves to renew first, not to refuse the write", read, n)
	}
	w.observe(500, 700*time.Millisecond)
	if got := w.need(500, read); got != 1400*time.Millisecond {
		t.Errorf("need(500) after a write of 500 in 700ms = %s, want 1.4s: the write, not the read", got)
	}
}

// Writes of a few events that were slow for reasons of their own do not
// make a full batch look too slow to write, nor do writes of one size
// alone make up a cost per event. Taking the fastest write as the base
// and the worst excess per event as the cost, one write of one event at
// 1 s over a base of 600 ms made a batch of 500 need minutes, and every
// claim after it was trimmed to one event.
func TestWriteTimesSlowSmallWritesDoNotTrimEverything(t *testing.T) {
	t.Parallel()
	validFor := 5 * time.Second // a term's validity, renewed
	var w writeTimes
	for _, d := range []time.Duration{600, 1640, 900, 1300} {
		w.observe(1, d*time.Millisecond)
	}
	if n := w.fit(500, validFor); n != 500 {
		t.Errorf("after writes of one event only: fit(500, %s) = %d (need %s), want all 500", validFor, n, w.need(500, 0))
	}
	for range 3 {
		w.observe(500, 950*time.Millisecond) // 0.7 ms an event over the base
	}
	w.observe(40, 1500*time.Millisecond)
	if n := w.fit(500, validFor); n != 500 {
		t.Errorf("fit(500, %s) = %d (need %s), want all 500", validFor, n, w.need(500, 0))
	}
	// But a database that is slow per event still is.
	for range writeTimesKept - 1 {
		w.observe(500, 600*time.Millisecond+500*10*time.Millisecond) // 10 ms an event
	}
	w.observe(1, 600*time.Millisecond)
	if n := w.fit(500, validFor); n >= 500 || n < 1 {
		t.Errorf("fit(500, %s) at 10 ms an event = %d, want fewer than 500, at least one", validFor, n)
	}
}

func TestIsTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("claim 500 events: %w", context.DeadlineExceeded), true},
		{timeoutNetError{}, true},
		{errors.New("connection refused"), false},
		{context.Canceled, false},
		{nil, false},
	} {
		if got := isTimeout(tc.err); got != tc.want {
			t.Errorf("isTimeout(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

type timeoutNetError struct{}

func (timeoutNetError) Error() string   { return "i/o timeout" }
func (timeoutNetError) Timeout() bool   { return true }
func (timeoutNetError) Temporary() bool { return true }

// slowStore times out every read while slow is set, as a database too
// busy for the claim's deadline, and counts the size each read asked for.
type slowStore struct {
	Store
	slow  bool
	asked []int
}

func (s *slowStore) ReadClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) ([]bson.Raw, bool, error) {
	s.asked = append(s.asked, limit.Events)
	if s.slow {
		return nil, false, fmt.Errorf("find: %w", context.DeadlineExceeded)
	}
	return s.Store.ReadClaimable(ctx, now, limit)
}

// A claim that times out halves the next one, down to one event, and
// claims that succeed grow it back; the limit is a metric.
func TestTimeoutsShrinkTheNextClaim(t *testing.T) {
	t.Parallel()
	r := setup(t)
	store := &slowStore{Store: r.store, slow: true}
	c, m := newClaimer(t, store, newPublisher(t, r.exchange), Config{BatchSize: 40})
	insertEvents(t, r.coll, 500, "order.created")

	for range 7 {
		if _, err := c.runOnce(t.Context()); !isTimeout(err) {
			t.Fatalf("runOnce on a store that times out: %v, want a timeout", err)
		}
	}
	if want := []int{40, 20, 10, 5, 2, 1, 1}; fmt.Sprint(store.asked) != fmt.Sprint(want) {
		t.Errorf("claims asked for %v events, want %v", store.asked, want)
	}
	if !c.Slow() {
		t.Error("Slow() = false after timeouts, want true")
	}
	if got := testutil.ToFloat64(m.ClaimBatchLimit); got != 1 {
		t.Errorf("claim_batch_limit = %v, want 1", got)
	}

	store.slow, store.asked = false, nil
	step := 40 / batchRegrowClaims
	claims := (40 + step - 1) / step
	for range claims {
		runOnce(t, c)
	}
	if want := []int{1, 1 + step, 1 + 2*step}; fmt.Sprint(store.asked[:3]) != fmt.Sprint(want) {
		t.Errorf("claims after the database recovered asked for %v, want to start %v", store.asked, want)
	}
	if got := c.BatchLimit(); got != 40 {
		t.Errorf("batch limit after %d full claims = %d, want back at 40", claims, got)
	}
	if c.Slow() {
		t.Error("Slow() = true once the limit is back, want false")
	}
}

// lateWriteStore reports every claim's write timed out at once, and
// applies it only when told: a write that lands after the client gave up.
type lateWriteStore struct {
	Store
	land chan func()
}

func (s *lateWriteStore) ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	s.land <- func() { _, _ = s.Store.ClaimRead(context.WithoutCancel(ctx), lease, docs, limit) }
	return events.ClaimResult{}, fmt.Errorf("claim %d events: %w", len(docs), context.DeadlineExceeded)
}

// A claim that timed out leaves nothing PROCESSING for recovery to find,
// even when its write lands after the claimer gave up on it: the lease is
// released again, with backoff, until the stale threshold.
func TestTimedOutClaimLandingLateIsReleased(t *testing.T) {
	t.Parallel()
	r := setup(t)
	store := &lateWriteStore{Store: r.store, land: make(chan func(), 1)}
	clock := fakeclock.New(time.Now())
	c, _ := newClaimer(t, store, newPublisher(t, r.exchange), Config{BatchSize: 10, Archetype: service.Archetype{Now: clock.Now}, StaleAfter: time.Minute})
	insertEvents(t, r.coll, 10, "order.created")

	if _, err := c.runOnce(t.Context()); !isTimeout(err) {
		t.Fatalf("runOnce: %v, want the write's timeout", err)
	}
	(<-store.land)() // the server applies the claim after the first release
	if n := inStatus(t, r.coll, events.StatusProcessing); n != 10 {
		t.Fatalf("%d events PROCESSING after the late write, want 10", n)
	}
	clock.Advance(abandonSettle)
	c.abandoned.retry(t.Context(), store, clock.Now(), discard)
	for id, d := range allEvents(t, r.coll) {
		if d.Status != events.StatusNew || d.Attempts != 0 || d.ClaimToken != "" {
			t.Errorf("event %s: %s, attempts %d, token %q; want NEW with its attempt refunded", id, d.Status, d.Attempts, d.ClaimToken)
		}
	}
}

// inStatus counts the stored events in status.
func inStatus(t *testing.T, coll *driver.Collection, status events.Status) int {
	t.Helper()
	n := 0
	for _, d := range allEvents(t, coll) {
		if d.Status == status {
			n++
		}
	}
	return n
}

// slowMarkStore times out the first PUBLISHED write of each batch, after
// letting it land: the outcome write that timed out is retried, and
// changes nothing the second time.
type slowMarkStore struct {
	Store
	marks int
}

func (s *slowMarkStore) MarkPublished(ctx context.Context, lease events.Lease, ids []any, at time.Time) (int, error) {
	s.marks++
	n, err := s.Store.MarkPublished(ctx, lease, ids, at)
	if s.marks == 1 {
		return 0, fmt.Errorf("mark %d events published: %w", len(ids), context.DeadlineExceeded)
	}
	return n, err
}

// An outcome write that times out halves the next claim too, and the
// batch it was for is still settled.
func TestOutcomeWriteTimeoutShrinksTheNextClaim(t *testing.T) {
	t.Parallel()
	r := setup(t)
	store := &slowMarkStore{Store: r.store}
	c, _ := newClaimer(t, store, newPublisher(t, r.exchange), Config{BatchSize: 20})
	insertEvents(t, r.coll, 20, "order.created")

	runOnce(t, c)
	if got := c.BatchLimit(); got != 10 {
		t.Errorf("batch limit after an outcome write timed out = %d, want 10", got)
	}
	if n := inStatus(t, r.coll, events.StatusPublished); n != 20 {
		t.Errorf("%d events PUBLISHED, want all 20: the timed-out write is retried", n)
	}
}

// failOnceStore reports the first claim's write timed out without
// applying it, and lets the rest through.
type failOnceStore struct {
	Store
	failed bool
}

func (s *failOnceStore) ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error) {
	if !s.failed {
		s.failed = true
		return events.ClaimResult{}, fmt.Errorf("claim %d events: %w", len(docs), context.DeadlineExceeded)
	}
	return s.Store.ClaimRead(ctx, lease, docs, limit)
}

// The aggregates of a claim whose write failed stay held for this
// worker's next claims until a release after the first, and after the
// write's own deadline, finds nothing left to put back: the write may
// still be landing, and an event it turns PROCESSING after the next claim read the
// held keys must not have its later events claimed past it. Other
// aggregates flow meanwhile.
func TestFailedWriteHoldsItsAggregates(t *testing.T) {
	t.Parallel()
	r := setup(t)
	store := &failOnceStore{Store: r.store}
	clock := fakeclock.New(time.Now())
	c, _ := newClaimer(t, store, newPublisher(t, r.exchange), Config{BatchSize: 10, Archetype: service.Archetype{Now: clock.Now}, StaleAfter: time.Minute, Ordering: OrderingAggregate})
	insertAggregates(t, r, "held", 3)
	if _, err := c.runOnce(t.Context()); !isTimeout(err) {
		t.Fatalf("first runOnce: %v, want the write's timeout", err)
	}
	insertAggregates(t, r, "free", 3) // inserted after: not in the failed write
	runOnce(t, c)
	for _, e := range allEvents(t, r.coll) {
		if strings.HasPrefix(fmt.Sprint(e.AggregateID), "held") && e.Status != events.StatusNew {
			t.Errorf("event of %s %s after the failed write, want NEW: its aggregate is held", e.AggregateID, e.Status)
		}
	}
	if n := inStatus(t, r.coll, events.StatusPublished); n == 0 {
		t.Error("nothing published: the aggregates the failed write did not touch must flow")
	}
	// The write failed at once, but could land until its deadline (the
	// stale threshold, without an owner): a release that finds nothing
	// after that frees them.
	clock.Advance(time.Minute + abandonSettle)
	for range 3 {
		runOnce(t, c)
	}
	if n := inStatus(t, r.coll, events.StatusNew); n != 0 {
		t.Errorf("%d events still NEW once the failed lease went stale, want none", n)
	}
}

// insertAggregates inserts two events each of n aggregates named prefix-i.
func insertAggregates(t *testing.T, r testBundle, prefix string, n int) {
	t.Helper()
	var docs []any
	for i := range 2 * n {
		d := events.Draft{Type: "order.changed", AggregateType: "order", AggregateID: fmt.Sprintf("%s-%d", prefix, i%n),
			Payload: bson.D{{Key: "n", Value: i}}}
		doc, err := d.Document(time.Now().Add(time.Duration(i) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, doc)
	}
	if _, err := r.coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatal(err)
	}
}

// A refused event whose FAILED write failed too is counted, apart from
// those written FAILED: it stays NEW and holds its aggregate.
func TestUnwrittenRefusalsAreCounted(t *testing.T) {
	t.Parallel()
	c, m := newClaimer(t, lostRaceStore{}, idlePublisher{t}, Config{})
	c.noteRejected([]events.Rejected{
		{ID: "a", LastError: "claim refused by the server: overflow", Err: errors.New("mark 1 events failed: timeout")},
		{ID: "b", LastError: "invalid event"},
	})
	if got := testutil.ToFloat64(m.Unwritable); got != 1 {
		t.Errorf("claim_refusals_unwritten_total = %v, want 1", got)
	}
}

// After one timeout, a quiet outbox brings the batch limit back to the
// batch size over its ticks: claims that find everything there was take
// fewer events than the limit, and the limit grew only after a full one,
// so Slow() stayed true and recovery, the sampler and retention kept
// backing off for as long as the outbox stayed quiet.
func TestBatchLimitDriftsBackOverQuietTicks(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	insertEvents(t, store.Collection(), 3, "order.created")
	c, m := newClaimer(t, store, confirmAll{}, Config{BatchSize: 40})
	c.shrink("claim", context.DeadlineExceeded)
	if !c.Slow() {
		t.Fatal("Slow() = false after a timeout: the test does not test the case")
	}
	for range 2 * batchRegrowClaims {
		runOnce(t, c)
	}
	if c.Slow() || c.BatchLimit() != 40 {
		t.Errorf("after %d quiet ticks: Slow() = %t, batch limit %d; want false, back at 40", 2*batchRegrowClaims, c.Slow(), c.BatchLimit())
	}
	if got := testutil.ToFloat64(m.ClaimBatchLimit); got != 40 {
		t.Errorf("claim_batch_limit = %v, want 40", got)
	}
}

// confirmAll is a broker that confirms every publish.
type confirmAll struct{}

func (confirmAll) Ready() error { return nil }

func (confirmAll) Publish(_ context.Context, msgs []events.Message) []error {
	return make([]error, len(msgs))
}
