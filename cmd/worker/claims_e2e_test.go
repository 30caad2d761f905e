package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// claimsScenario: claimers (goroutines, each a mongo.Store with leases of
// its own) claim one backlog of n until it is empty. Each event must be
// claimed; on MongoDB, by exactly one claimer.
func claimsScenario(t *testing.T, s stack, claimers, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db := s.database(t)
	ids := insertBacklog(ctx, t, db.Collection(mongo.CollectionDefault), n, "e2e.claimed")

	stores := make([]*mongo.Store, claimers)
	for i := range stores {
		stores[i] = mongo.New(s.connect(t, 4), mongo.Config{Database: db.Name()})
		if err := stores[i].Prepare(ctx); err != nil {
			t.Fatalf("prepare claimer %d: %v", i, err)
		}
	}
	claimedBy := make([][]string, claimers)
	errs := make([]error, claimers)
	var wg sync.WaitGroup
	for i, store := range stores {
		wg.Go(func() {
			workerID := fmt.Sprintf("claimer-%d", i)
			for {
				lease := events.Lease{WorkerID: workerID, Token: bson.NewObjectID().Hex(), At: time.Now().UTC().Truncate(time.Millisecond)}
				got, _, err := claimN(ctx, store, lease, 50)
				if err != nil {
					errs[i] = err
					return
				}
				if len(got) == 0 {
					// Empty means this claim lost every race, or the
					// backlog is gone: only the second ends the loop.
					left, err := store.Collection().CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}})
					if err != nil || left == 0 {
						errs[i] = err
						return
					}
					continue
				}
				for _, c := range got {
					claimedBy[i] = append(claimedBy[i], testenv.MessageID(c.ID))
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("claim: %v", err)
	}
	owners := map[string]int{}
	var claims int
	for _, got := range claimedBy {
		claims += len(got)
		for _, id := range got {
			owners[id]++
		}
	}
	var overlap int
	for _, c := range owners {
		overlap += c - 1
	}
	perClaimer := make([]int, claimers)
	for i := range claimedBy {
		perClaimer[i] = len(claimedBy[i])
	}
	t.Logf("%d claimers took %v of %d events: %d claims, %d claimed twice or more", claimers, perClaimer, n, claims, overlap)
	fmt.Printf("E2E-CLAIMS-FIGURES: backend=%s claimers=%d events=%d claims=%d overlap=%d\n", s.name, claimers, n, claims, overlap)
	for _, id := range ids {
		if owners[id] == 0 {
			t.Errorf("event %s was never claimed", id)
		}
	}
	if len(owners) != n {
		t.Errorf("claimed %d distinct events, want %d", len(owners), n)
	}
	if s.atomicClaims && overlap != 0 {
		t.Errorf("%d events claimed by more than one claimer on MongoDB, want none", overlap)
	}
}
