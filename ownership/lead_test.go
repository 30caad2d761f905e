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
