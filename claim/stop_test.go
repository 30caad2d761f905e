package claim

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// oneEventStore hands out one valid event, then nothing, and holds its
// PUBLISHED write until the write's context ends: a database that stopped
// answering between the confirm and the mark.
type oneEventStore struct {
	Store
	handedOut bool
	marking   chan struct{} // closed when the mark has started
	markErr   chan error    // the mark's context error when it gave up
}

func (s *oneEventStore) ReadClaimable(_ context.Context, now time.Time, _ events.ClaimLimit) ([]bson.Raw, bool, error) {
	if s.handedOut {
		return nil, false, nil
	}
	s.handedOut = true
	doc, err := events.Draft{Type: "order.created", Payload: bson.D{{Key: "n", Value: 1}}}.Document(now)
	if err != nil {
		return nil, false, err
	}
	raw, err := bson.Marshal(doc)
	return []bson.Raw{raw}, false, err
}

func (s *oneEventStore) ClaimRead(_ context.Context, _ events.Lease, docs []bson.Raw, _ events.ClaimLimit) (events.ClaimResult, error) {
	id := docs[0].Lookup(events.FieldID).ObjectID()
	return events.ClaimResult{Claimed: []events.Claimed{{ID: id, Attempts: 1, Doc: docs[0]}}}, nil
}

func (s *oneEventStore) MarkPublished(ctx context.Context, _ events.Lease, _ []any, _ time.Time) (int, error) {
	close(s.marking)
	<-ctx.Done()
	s.markErr <- ctx.Err()
	return 0, ctx.Err()
}

// startTriggered starts c, whose schedule must not fire during the test,
// triggers one run, and waits until reached is closed: the run got as far
// as the test needs. It fails with never if that takes longer than waitFor.
func startTriggered(t *testing.T, c *Claimer, reached <-chan struct{}, never string) {
	t.Helper()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.Trigger()
	select {
	case <-reached:
	case <-time.After(waitFor):
		t.Fatal(never)
	}
}

// confirmingPublisher confirms every message.
type confirmingPublisher struct{}

func (confirmingPublisher) Ready() error { return nil }

func (confirmingPublisher) Publish(_ context.Context, msgs []events.Message) []error {
	return make([]error, len(msgs))
}

// Outcome writes outlive the shutdown's cancellation and a database outage,
// up to the lease, but not a stop's deadline: Stop returns when its time is
// up, and the write in flight is cancelled.
func TestStopEndsOutcomeWritesAtItsDeadline(t *testing.T) {
	t.Parallel()
	store := &oneEventStore{marking: make(chan struct{}), markErr: make(chan error, 1)}
	c, _ := newClaimer(t, store, confirmingPublisher{}, Config{Schedule: "@every 1h"})
	startTriggered(t, c, store.marking, "the claimer never tried to mark its batch")

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(ctx) }()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Stop = %v, want %v", err, context.DeadlineExceeded)
		}
	case <-time.After(waitFor):
		t.Fatalf("Stop did not return within %s of its 300ms deadline: the mark holds it up", waitFor)
	}
	select {
	case err := <-store.markErr:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the mark gave up with %v, want %v (cancelled by the stop)", err, context.Canceled)
		}
	default:
		t.Error("the mark was still running after Stop returned")
	}
}

// claimN claims up to n events with no byte bound, as Claim did before
// it took a ClaimLimit.
func claimN(ctx context.Context, s *mongo.Store, lease events.Lease, n int) ([]events.Claimed, bool, error) {
	res, err := s.Claim(ctx, lease, events.ClaimLimit{Events: n})
	return res.Claimed, res.More, err
}

// stopSpyStore reports a full batch lost to other replicas (so the drain
// asks for more) from a Claim that returns only once Stop has begun, and
// counts its claims.
type stopSpyStore struct {
	Store
	c       *Claimer
	claims  atomic.Int32
	started chan struct{}
}

func (s *stopSpyStore) ReadClaimable(context.Context, time.Time, events.ClaimLimit) ([]bson.Raw, bool, error) {
	if s.claims.Add(1) == 1 {
		close(s.started)
	}
	<-s.c.stopping
	s.c.Trigger() // a Trigger during the stop must not start a claim either
	return nil, true, nil
}

// Nothing is claimed after SIGTERM: once Stop has been called, neither the
// drain of a backlog nor a pending Trigger starts another claim.
func TestNoClaimAfterStop(t *testing.T) {
	t.Parallel()
	store := &stopSpyStore{started: make(chan struct{})}
	c, _ := newClaimer(t, store, idlePublisher{t}, Config{Schedule: "@every 1h"})
	store.c = c
	startTriggered(t, c, store.started, "the claimer never claimed")
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got := store.claims.Load(); got != 1 {
		t.Errorf("claims = %d, want 1: a claim started after Stop", got)
	}
	// runOnce itself refuses once stopped.
	if more, err := c.runOnce(t.Context()); more || err != nil || store.claims.Load() != 1 {
		t.Errorf("runOnce after Stop = %t, %v with %d claims; want false, nil and no claim", more, err, store.claims.Load())
	}
}
