package claim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/service"
)

// cuttingPublisher is the real publisher, except that during its cutAt-th
// Publish it cuts the broker link halfway through the batch: the first half
// is confirmed, the second is in flight when the connection dies.
type cuttingPublisher struct {
	*broker.Publisher
	proxy *testenv.Proxy
	cutAt int

	calls    int
	cutBatch []events.Message
	cutErrs  []error
	cutTime  time.Time
}

func (p *cuttingPublisher) Publish(ctx context.Context, msgs []events.Message) []error {
	p.calls++
	if p.calls != p.cutAt {
		return p.Publisher.Publish(ctx, msgs)
	}
	half := len(msgs) / 2
	errs := p.Publisher.Publish(ctx, msgs[:half])
	p.proxy.Cut()
	p.cutTime = time.Now()
	errs = append(errs, p.Publisher.Publish(ctx, msgs[half:])...)
	p.cutBatch, p.cutErrs = msgs, errs
	return errs
}

// TestOutageBroker cuts the broker link in the middle of a batch, in the
// middle of a backlog: the events in flight go back to NEW with their
// attempt refunded, none fails, claiming pauses until the publisher has
// reconnected by itself, and then the whole backlog is delivered.
func TestOutageBroker(t *testing.T) {
	t.Parallel()
	r := newOutageRig(t)
	pub := &cuttingPublisher{Publisher: r.pub, proxy: r.amqpProxy, cutAt: outageCutAt}
	c := r.newClaimer(r.store, pub)

	r.runUntil(c, "the cut", func() bool { return pub.cutBatch != nil })

	// The batch of the cut: first half confirmed, second half unavailable.
	half := len(pub.cutBatch) / 2
	var inFlight []string
	for i, err := range pub.cutErrs {
		switch {
		case i < half && err != nil:
			t.Errorf("message %d of the cut batch, published before the cut: %v", i, err)
		case i >= half && !errors.Is(err, events.ErrUnavailable) && !errors.Is(err, events.ErrUnconfirmed):
			t.Errorf("message %d of the cut batch, published after the cut: %v, want ErrUnavailable", i, err)
		case i >= half:
			inFlight = append(inFlight, pub.cutBatch[i].ID)
		}
	}
	if len(inFlight) == 0 {
		t.Fatal("no message was in flight at the cut")
	}
	docs := r.docs()
	for _, id := range inFlight {
		d := docs[id]
		if d.Status != events.StatusNew || d.Attempts != 0 || d.WorkerID != "" || !strings.Contains(d.LastError, "broker unavailable") {
			t.Errorf("in-flight event %s after the cut = %+v, want NEW, attempts 0 (refunded), no workerId, lastError naming the outage", id, d)
		}
	}
	for _, m := range pub.cutBatch[:half] {
		if d := docs[m.ID]; d.Status != events.StatusPublished {
			t.Errorf("event %s confirmed before the cut is %s, want PUBLISHED", m.ID, d.Status)
		}
	}

	// Claiming pauses while the broker is out of reach.
	r.poll(outageWait, "publisher reports the cut", func() bool { return r.pub.Ready() != nil })
	claimed := testutil.ToFloat64(r.metrics.Claimed)
	newBefore := r.count(events.StatusNew)
	for range 3 {
		more, err := c.runOnce(t.Context())
		if more || err != nil {
			t.Errorf("runOnce during the outage = (%t, %v), want (false, nil): a pause, not an error", more, err)
		}
	}
	if got := testutil.ToFloat64(r.metrics.Claimed); got != claimed {
		t.Errorf("claimed %v events during the outage, want 0", got-claimed)
	}
	if got := r.count(events.StatusNew); got != newBefore {
		t.Errorf("NEW events during the outage: %d, then %d; want no change", newBefore, got)
	}
	if got := r.count(events.StatusProcessing); got != 0 {
		t.Errorf("%d events PROCESSING during the outage, want 0 (all released)", got)
	}
	if got := r.count(events.StatusFailed); got != 0 {
		t.Errorf("%d events FAILED during the outage, want 0", got)
	}

	// The worker runs on its schedule from now on, paused, through the
	// Restore, and recovers by itself.
	remaining := r.count(events.StatusNew)
	publishedAtRestore := testutil.ToFloat64(r.metrics.Published)
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	outage := restored.Sub(pub.cutTime)
	r.amqpProxy.Restore()
	r.poll(outageWait, "publisher reconnects", func() bool { return r.pub.Ready() == nil })
	reconnect := time.Since(restored)
	r.poll(outageWait, "claiming resumes", func() bool {
		return testutil.ToFloat64(r.metrics.Published) > publishedAtRestore
	})
	resumed := time.Since(restored)
	drained := r.drainAndStop(c, restored)

	duplicates, maxAttempts := r.requireAllPublishedOnce()
	if maxAttempts != 1 {
		t.Errorf("an event took %d attempts, want 1: a broker outage must refund every attempt it cost", maxAttempts)
	}
	t.Logf("FAULT-FIGURES: broker cut mid-batch: events sent %d, delivered %d distinct (%d deliveries), duplicates %d, FAILED %d, in flight at the cut %d (released to NEW, attempt refunded), max attempts %d",
		outageEvents, r.inbox.distinct(), r.inbox.deliveries(), duplicates, r.count(events.StatusFailed), len(inFlight), maxAttempts)
	t.Logf("FAULT-FIGURES: broker cut mid-batch: outage %s; after Restore, publisher ready in %s, first batch PUBLISHED in %s, backlog of %d NEW fully PUBLISHED in %s (claim schedule @every 100ms, reconnect backoff 50ms..500ms)",
		outage.Round(time.Millisecond), reconnect.Round(time.Millisecond), resumed.Round(time.Millisecond), remaining, drained.Round(time.Millisecond))
}

// cuttingStore is the real store, except that it cuts the database link
// just before its cutAt-th MarkPublished: the batch is confirmed by the
// broker but cannot be marked, the worst moment for a database outage.
// With blip set, it restores the link as soon as that mark has failed: an
// outage shorter than the lease, such as a replica set failover.
type cuttingStore struct {
	*mongo.Store
	proxy *testenv.Proxy
	cutAt int
	blip  bool

	marks   int
	cut     []any // ids of the batch that could not be marked
	cutErr  error // what the mark at the cut returned
	cutTime time.Time
}

func (s *cuttingStore) MarkPublished(ctx context.Context, lease events.Lease, ids []any, at time.Time) (int, error) {
	s.marks++
	if s.marks != s.cutAt {
		return s.Store.MarkPublished(ctx, lease, ids, at)
	}
	s.proxy.Cut()
	s.cut, s.cutTime = ids, time.Now()
	n, err := s.Store.MarkPublished(ctx, lease, ids, at)
	s.cutErr = err
	if s.blip {
		s.proxy.Restore()
	}
	return n, err
}

// TestOutageDatabaseBlip cuts the database link after a batch was confirmed
// and before it was marked PUBLISHED, and restores it once that mark has
// failed. The claimer retries the mark within its lease: the batch ends
// PUBLISHED by the same run, delivered once, with nothing left to recovery.
func TestOutageDatabaseBlip(t *testing.T) {
	t.Parallel()
	r := newOutageRig(t)
	store := &cuttingStore{Store: r.store, proxy: r.dbProxy, cutAt: 2, blip: true}
	c := r.newClaimer(store, r.pub)

	for i := 0; store.cut == nil; i++ {
		if i > store.cutAt {
			t.Fatalf("no cut after %d runs", i)
		}
		if _, err := c.runOnce(t.Context()); err != nil {
			t.Fatalf("runOnce #%d: %v (the mark at the cut failed with: %v)", i+1, err, store.cutErr)
		}
	}
	if store.cutErr == nil {
		t.Fatal("the mark at the cut succeeded: the link was not cut")
	}
	t.Logf("the mark at the cut failed with %v; the claimer retried it", store.cutErr)

	docs := r.docs()
	var cutIDs []string
	for _, id := range store.cut {
		hex := id.(bson.ObjectID).Hex()
		cutIDs = append(cutIDs, hex)
		if d := docs[hex]; d.Status != events.StatusPublished || d.Attempts != 1 {
			t.Errorf("event %s of the batch whose mark was cut = %+v, want PUBLISHED after 1 attempt", hex, d)
		}
	}
	published := store.cutAt * outageBatchSize
	if got := testutil.ToFloat64(r.metrics.Published); got != float64(published) {
		t.Errorf("published metric = %v, want %d", got, published)
	}
	if got := testutil.ToFloat64(r.metrics.LostClaims); got != 0 {
		t.Errorf("lost claims = %v, want 0", got)
	}
	r.poll(outageWait, "both batches delivered", func() bool { return r.inbox.distinct() >= published })
	counts := r.inbox.Counts()
	for _, id := range cutIDs {
		if counts[id] != 1 {
			t.Errorf("event %s of the batch whose mark was cut delivered %d times, want once", id, counts[id])
		}
	}
	t.Logf("FAULT-FIGURES: database blip during a mark: batch of %d confirmed, mark failed, link restored at once; "+
		"the batch PUBLISHED by the same run %s after the cut; %d deliveries of %d events, 0 duplicates, 0 left to recovery",
		len(store.cut), time.Since(store.cutTime).Round(time.Millisecond), r.inbox.deliveries(), published)
}

// TestOutageDatabase cuts the database link after a batch was confirmed and
// before it was marked PUBLISHED, for longer than the lease: runOnce retries
// the mark until the lease runs out, then fails, and the worker carries on;
// claiming fails while the link is down; after Restore the claimer and the
// recovery job (which resets the stuck batch), running on their schedules
// since before the Restore, finish the backlog by themselves. The stuck
// batch is delivered twice: that is at-least-once delivery, counted.
func TestOutageDatabase(t *testing.T) {
	t.Parallel()
	r := newOutageRig(t)
	store := &cuttingStore{Store: r.store, proxy: r.dbProxy, cutAt: outageCutAt}
	c := r.newClaimer(store, r.pub)

	var cutErr error
	for i := 0; store.cut == nil; i++ {
		if i > outageCutAt+2 {
			t.Fatalf("no cut after %d runs", i)
		}
		_, err := c.runOnce(t.Context())
		if store.cut != nil {
			cutErr = err
		} else if err != nil {
			t.Fatalf("runOnce before the cut: %v", err)
		}
	}
	if cutErr == nil {
		t.Fatal("runOnce whose mark was cut returned no error")
	}
	t.Logf("runOnce whose mark was cut: %v", cutErr)

	// While the link is down, every run fails, and nothing panics.
	for i := range 3 {
		more, err := c.runOnce(t.Context())
		if err == nil || more {
			t.Errorf("runOnce #%d during the database outage = (%t, %v), want (false, an error)", i+1, more, err)
		}
	}
	stuck := map[string]bool{}
	for _, id := range store.cut {
		stuck[id.(bson.ObjectID).Hex()] = true
	}
	docs := r.docs()
	for id := range stuck {
		if d := docs[id]; d.Status != events.StatusProcessing || d.WorkerID != outageWorkerID {
			t.Errorf("event %s of the unmarked batch = %+v, want still PROCESSING under %s", id, d, outageWorkerID)
		}
	}
	if got := r.count(events.StatusFailed); got != 0 {
		t.Errorf("%d events FAILED during the database outage, want 0", got)
	}

	// The claimer and the recovery job run on their schedules from now on,
	// through the rest of the outage and the Restore.
	rec, err := recovery.New(r.store, recovery.Config{
		Schedule: "@every 1s", StaleAfter: outageStaleAfter, MaxAttempts: MaxAttemptsDefault,
		Archetype: service.Archetype{Logger: r.logger, Metrics: r.metrics},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), outageWait)
		defer cancel()
		_ = rec.Stop(ctx)
	})
	remaining := r.count(events.StatusNew) + r.count(events.StatusProcessing)
	claimErrors := r.metrics.JobErrors.WithLabelValues("claim")
	failedRuns := testutil.ToFloat64(claimErrors)
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := rec.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.poll(outageWait, "a scheduled claim fails during the outage", func() bool {
		return testutil.ToFloat64(claimErrors) > failedRuns
	})
	restored := time.Now()
	outage := restored.Sub(store.cutTime)
	r.dbProxy.Restore()
	r.poll(outageWait, "claiming resumes", func() bool {
		return testutil.ToFloat64(r.metrics.Published) > float64((outageCutAt-1)*outageBatchSize)
	})
	resumed := time.Since(restored)
	drained := r.drainAndStop(c, restored)

	duplicates, maxAttempts := r.requireAllPublishedOnce()
	counts := r.inbox.Counts()
	for id := range stuck {
		if counts[id] < 2 {
			// Not a failure of the relay, but then this test did not test
			// the redelivery it is about.
			t.Errorf("event %s of the unmarked batch delivered %d times, want twice (once before the cut, once after recovery)", id, counts[id])
		}
	}
	t.Logf("FAULT-FIGURES: database cut before a mark: events sent %d, delivered %d distinct (%d deliveries), duplicates %d, FAILED %d, confirmed but unmarked at the cut %d (reset by recovery), recovered %v, max attempts %d",
		outageEvents, r.inbox.distinct(), r.inbox.deliveries(), duplicates, r.count(events.StatusFailed), len(stuck),
		testutil.ToFloat64(r.metrics.Recovered), maxAttempts)
	t.Logf("FAULT-FIGURES: database cut before a mark: outage %s; after Restore, first batch PUBLISHED in %s, backlog of %d unpublished (%d of them stuck PROCESSING) fully PUBLISHED in %s (recovery @every 1s with stale-after %s, so the stuck batch waits until stale-after has passed since its claim; production defaults: 60s stale-after, recovery every 2 min)",
		outage.Round(time.Millisecond), resumed.Round(time.Millisecond), remaining, len(stuck), drained.Round(time.Millisecond), outageStaleAfter)
}
