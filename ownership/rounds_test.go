package ownership

import (
	"context"
	"testing"

	"github.com/outboxrelay/outbox/internal/fakeclock"
)

// countingTable is one replica's view of a shared table that counts the
// heartbeats and prunes that replica sends.
type countingTable struct {
	*memTable
	heartbeats, prunes int
}

func (t *countingTable) Heartbeat(ctx context.Context, m Member) error {
	t.heartbeats++
	return t.memTable.Heartbeat(ctx, m)
}

func (t *countingTable) Prune(ctx context.Context, terms []Term, members []string) error {
	t.prunes++
	return t.memTable.Prune(ctx, terms, members)
}

// Rounds run every roundMax, but a settled round is a read: a replica
// writes its heartbeat once a third of a term, which is enough for the
// others to count it live (the shares hold still over many terms), and
// only the leader prunes the old terms, for all.
func TestSettledRoundsOnlyRead(t *testing.T) {
	t.Parallel()
	shared, clock := newMemTable(), fakeclock.New(epoch)
	ta, tb := &countingTable{memTable: shared}, &countingTable{memTable: shared}
	a, b := newManager(t, ta, clock, "a"), newManager(t, tb, clock, "b")
	for range 4 { // a gives back half, b takes it once the margin has passed
		tick(t, a, b)
		clock.Advance(roundMax)
	}
	if got := checkDisjoint(t, a, b); got != 64 {
		t.Fatalf("owned after balancing: %d partitions, want 64", got)
	}
	beats := ta.heartbeats

	const terms = 3
	rounds := int(terms * term / roundMax)
	for range rounds {
		clock.Advance(roundMax)
		tick(t, a, b)
		if n := len(holding(a)); n != 32 {
			t.Fatalf("a holds %d partitions at %s, want 32: a live replica's share moved", n, clock.Now().Sub(epoch))
		}
	}
	if got, want := ta.heartbeats-beats, 3*terms; got != want {
		t.Errorf("heartbeats of a over %d rounds (%d terms): %d, want %d (one a third of a term)", rounds, terms, got, want)
	}
	leader, follower := ta, tb
	if b.Leads() {
		leader, follower = tb, ta
	}
	if leader.prunes == 0 || follower.prunes != 0 {
		t.Errorf("prunes: leader %d, other %d; want the leader's alone", leader.prunes, follower.prunes)
	}
	// A round prunes what it read, before its own renewal: the latest
	// three terms of a partition may stand for a moment.
	if n := len(shared.terms); n > 3*64 {
		t.Errorf("%d terms kept after %d renewals of 64 partitions, want at most the latest three of each", n, 3*terms)
	}
}
