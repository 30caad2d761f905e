package mongo_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

// fencedReplica is one replica's ownership on the owners collection of
// FerretDB, with its own Clock synced against the server and running on
// fake, so that the test moves its time and steps its wall clock.
func fencedReplica(t *testing.T, store *mongo.Store, fake *fakeclock.Clock, id string) *ownership.Manager {
	t.Helper()
	clock := mongo.NewClock(testenv.Client(t), nil)
	mongo.SetFakeClock(clock, fake)
	if err := clock.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	m, err := ownership.New(store.Owners(), ownership.Config{
		WorkerID: id, TermLength: 30 * time.Second, Synced: clock.Synced,
		Archetype: service.Archetype{Now: clock.Now, Local: fake.Mono, Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// owning counts the partitions m may claim in now.
func owning(m *ownership.Manager) int {
	terms, _, done := m.Hold()
	defer done()
	n := 0
	for _, x := range terms {
		if x != 0 {
			n++
		}
	}
	return n
}

// The time fence on FerretDB, with the terms in the owners collection: b's
// wall clock is stepped forward by two terms after its clock synced, and
// b's rounds still see a's terms run, so b takes none of a's partitions
// while a may claim in them. Before, b's server time was its wall clock
// plus the offset, and the step made a's terms look expired at once.
// Then a dies, and b takes the partitions only after a has stopped
// claiming in them.
func TestTimeFenceOnFerretDB(t *testing.T) {
	t.Parallel()
	store, _ := setup(t)
	fa, fb := fakeclock.New(time.Now()), fakeclock.New(time.Now())
	a, b := fencedReplica(t, store, fa, "a"), fencedReplica(t, store, fb, "b")
	advance := func(d time.Duration) { fa.Advance(d); fb.Advance(d) }
	tickBoth := func(ms ...*ownership.Manager) {
		t.Helper()
		for _, m := range ms {
			if err := m.Tick(t.Context()); err != nil {
				t.Fatalf("Tick: %v", err)
			}
		}
	}
	tickBoth(a)
	if n := owning(a); n != events.Partitions {
		t.Fatalf("a alone owns %d partitions, want %d", n, events.Partitions)
	}
	fb.Step(time.Minute) // NTP or an operator sets b's clock forward
	for range 5 {
		tickBoth(b)
		if na, nb := owning(a), owning(b); na+nb > events.Partitions {
			t.Fatalf("a may claim in %d partitions and b in %d: some in both", na, nb)
		}
		if nb := owning(b); nb != 0 {
			t.Fatalf("b took %d partitions of a's running terms after a wall-clock step", nb)
		}
		advance(time.Second)
	}
	// a dies now: b takes over once a's terms ran out, never before a
	// stopped claiming.
	for i := 0; owning(b) < events.Partitions; i++ {
		if i > 100 {
			t.Fatalf("b owns %d partitions 50 s after a died, want all", owning(b))
		}
		advance(500 * time.Millisecond)
		tickBoth(b)
		if na, nb := owning(a), owning(b); na > 0 && nb > 0 {
			t.Fatalf("a may still claim in %d partitions while b took %d", na, nb)
		}
	}
}
