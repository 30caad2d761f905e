package ownership

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/fakeclock"
)

// The owner of LeaderPartition leads, so at most one replica leads at a
// time, and OnLead fires once, in the round that makes a replica the
// leader: when it first takes the partition, and when it takes it over
// from a replica that died.
func TestLeadFollowsLeaderPartition(t *testing.T) {
	t.Parallel()
	table, clock := newMemTable(), fakeclock.New(epoch)
	leads := map[string]int{}
	start := func(id string) *Manager {
		return newManagerWith(t, table, clock, Config{WorkerID: id, OnLead: func() { leads[id]++ }})
	}
	a, b := start("a"), start("b")
	tick(t, a)
	tick(t, b)
	if !a.Leads() || b.Leads() || leads["a"] != 1 || leads["b"] != 0 {
		t.Fatalf("after a took every partition: a leads %t, b leads %t, OnLead a=%d b=%d; want a alone, once",
			a.Leads(), b.Leads(), leads["a"], leads["b"])
	}

	// Balancing and many more rounds: one leader throughout, no new OnLead.
	for range 20 {
		clock.Advance(roundMax)
		tick(t, a, b)
		if a.Leads() == b.Leads() {
			t.Fatalf("at %s: a leads %t, b leads %t; want exactly one", clock.Now().Format(time.TimeOnly), a.Leads(), b.Leads())
		}
	}
	leader, other := a, b
	if b.Leads() {
		leader, other = b, a
	}
	before := leads[other.cfg.WorkerID]

	// The leader dies: once its term has run out the other takes the
	// partition over and is told, once.
	for range 2 * int(term/roundMax) {
		clock.Advance(roundMax)
		tick(t, other)
	}
	if !other.Leads() || leader.Leads() {
		t.Fatalf("after the leader died: %s leads %t, dead %s leads %t", other.cfg.WorkerID, other.Leads(), leader.cfg.WorkerID, leader.Leads())
	}
	if got := leads[other.cfg.WorkerID] - before; got != 1 {
		t.Errorf("OnLead calls on taking the lead over: %d, want 1", got)
	}
}

// OnTake fires after each round that took partitions, so the claimer
// claims in them at once: a's first round, b's round that takes its
// share, and a's round that takes b's share back after b left. Rounds
// that take nothing do not fire it.
func TestOnTakeFollowsTheTakes(t *testing.T) {
	t.Parallel()
	table, clock := newMemTable(), fakeclock.New(epoch)
	takes := map[string]int{}
	start := func(id string) *Manager {
		return newManagerWith(t, table, clock, Config{WorkerID: id, OnTake: func() { takes[id]++ }})
	}
	a := start("a")
	tick(t, a)
	tick(t, a)
	if takes["a"] != 1 {
		t.Fatalf("OnTake fired %d times over a's first two rounds, want once: the second took nothing", takes["a"])
	}
	b := start("b")
	for range 10 {
		clock.Advance(roundMax)
		tick(t, a, b)
	}
	if takes["b"] == 0 || len(holding(b)) == 0 {
		t.Fatalf("b holds %d partitions, OnTake fired %d times; want its share taken and OnTake fired", len(holding(b)), takes["b"])
	}
	before := takes["a"]
	if err := b.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(roundMax)
	tick(t, a)
	if takes["a"] != before+1 {
		t.Errorf("OnTake fired %d times in a's round after b gave its share back, want once", takes["a"]-before)
	}
}
