package mongo_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

var _ ownership.Table = (*mongo.Owners)(nil)

// TestOwnersInsertHasOneWinner races many inserts of the same terms: on
// FerretDB as on MongoDB exactly one wins each term, which is what
// ownership rests on.
func TestOwnersInsertHasOneWinner(t *testing.T) {
	t.Parallel()
	store, _ := setup(t)
	owners := store.Owners()
	const racers, rounds = 8, 5
	for round := range rounds {
		var wins [3]atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for r := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				terms := make([]ownership.Term, 3)
				for p := range terms {
					terms[p] = ownership.Term{Partition: p, Term: int64(round + 1), Owner: string(rune('a' + r)), ExpiresAt: base}
				}
				won, err := owners.Insert(context.Background(), terms)
				if err != nil {
					t.Errorf("racer %d: Insert: %v", r, err)
					return
				}
				for p, w := range won {
					if w {
						wins[p].Add(1)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		for p := range wins {
			if n := wins[p].Load(); n != 1 {
				t.Errorf("round %d, partition %d: %d winners of %d racers, want 1", round, p, n, racers)
			}
		}
	}
}

func TestOwnersReadHeartbeatPrune(t *testing.T) {
	t.Parallel()
	store, _ := setup(t)
	owners := store.Owners()
	ctx := t.Context()
	if owners.Collection().Name() != store.Collection().Name()+"_owners" {
		t.Errorf("owners collection %q", owners.Collection().Name())
	}
	if _, err := owners.Insert(ctx, []ownership.Term{
		{Partition: 0, Term: 1, Owner: "a", ExpiresAt: base},
		{Partition: 0, Term: 2, Owner: "a", ExpiresAt: base.Add(time.Second)},
		{Partition: 5, Term: 1, Owner: "b", ExpiresAt: base, Released: true},
	}); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	for range 2 {
		if err := owners.Heartbeat(ctx, ownership.Member{WorkerID: "a", SeenAt: base}); err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}
	}
	terms, members, err := owners.Read(ctx)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	latest := ownership.Latest(terms)
	if len(terms) != 3 || latest[0].Term != 2 || !latest[0].ExpiresAt.Equal(base.Add(time.Second)) || !latest[5].Released || latest[5].Owner != "b" {
		t.Errorf("Read terms = %+v", terms)
	}
	if len(members) != 1 || members[0].WorkerID != "a" || !members[0].SeenAt.Equal(base) {
		t.Errorf("Read members = %+v", members)
	}
	if err := owners.Prune(ctx, []ownership.Term{{Partition: 0, Term: 1}}, []string{"a"}); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	terms, members, err = owners.Read(ctx)
	if err != nil || len(terms) != 2 || len(members) != 0 {
		t.Errorf("after Prune: %d terms, %d members, %v; want 2, 0", len(terms), len(members), err)
	}
}

// TestOwnershipManagersOnStore runs three managers on the real owners
// collection: together they hold every partition, none twice.
func TestOwnershipManagersOnStore(t *testing.T) {
	t.Parallel()
	store, _ := setup(t)
	var ms []*ownership.Manager
	now := base
	clock := func() time.Time { return now }
	for _, id := range []string{"a", "b", "c"} {
		m, err := ownership.New(store.Owners(), ownership.Config{WorkerID: id, TermLength: 30 * time.Second,
			Archetype: service.Archetype{Now: clock, Local: clock, Logger: slog.New(slog.DiscardHandler)}})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	// A round every 4 s, a bit more than the margin after which a
	// partition given back is free.
	for range 4 {
		for _, m := range ms {
			if err := m.Tick(t.Context()); err != nil {
				t.Fatalf("Tick: %v", err)
			}
		}
		now = now.Add(4 * time.Second)
	}
	seen := map[int]int{}
	for _, m := range ms {
		for _, p := range m.Owned() {
			seen[p]++
		}
	}
	for p := range events.Partitions {
		if seen[p] > 1 {
			t.Errorf("partition %d owned %d times", p, seen[p])
		}
	}
	if len(seen) < events.Partitions-2 {
		t.Errorf("%d partitions owned, want about %d", len(seen), events.Partitions)
	}
}
