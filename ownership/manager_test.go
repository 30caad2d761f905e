package ownership

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
)

// memTable is a Table in memory with the one property that matters: an
// insert of an existing term's _id loses.
type memTable struct {
	mu      sync.Mutex
	terms   map[string]Term
	members map[string]Member
	down    bool
}

func newMemTable() *memTable {
	return &memTable{terms: map[string]Term{}, members: map[string]Member{}}
}

func (t *memTable) Read(context.Context) ([]Term, []Member, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down {
		return nil, nil, context.DeadlineExceeded
	}
	var terms []Term
	for _, x := range t.terms {
		terms = append(terms, x)
	}
	var members []Member
	for _, m := range t.members {
		members = append(members, m)
	}
	return terms, members, nil
}

func (t *memTable) Insert(_ context.Context, terms []Term) ([]bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down {
		return nil, context.DeadlineExceeded
	}
	won := make([]bool, len(terms))
	for i, x := range terms {
		if _, ok := t.terms[x.ID()]; !ok {
			t.terms[x.ID()] = x
			won[i] = true
		}
	}
	return won, nil
}

func (t *memTable) Heartbeat(_ context.Context, m Member) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down {
		return context.DeadlineExceeded
	}
	t.members[m.WorkerID] = m
	return nil
}

func (t *memTable) Prune(_ context.Context, terms []Term, members []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, x := range terms {
		delete(t.terms, x.ID())
	}
	for _, m := range members {
		delete(t.members, m)
	}
	return nil
}

const term = 30 * time.Second

// epoch is where the tests' clock starts.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newManager returns the manager of worker id on table, with clock as the
// server's time and its own local time alike.
func newManager(t *testing.T, table Table, clock *fakeclock.Clock, id string) *Manager {
	t.Helper()
	return newManagerWith(t, table, clock, Config{WorkerID: id})
}

// newManagerWith is newManager with more of the Config set by the test.
func newManagerWith(t *testing.T, table Table, clock *fakeclock.Clock, cfg Config) *Manager {
	t.Helper()
	cfg.TermLength, cfg.Now, cfg.Local = term, clock.Now, clock.Now
	cfg.Logger = slog.New(slog.DiscardHandler)
	m, err := New(table, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

// startAlone returns a table and clock on which one replica, "a", has run
// its first round and taken every partition: where most interleavings
// start.
func startAlone(t *testing.T) (*memTable, *fakeclock.Clock, *Manager) {
	t.Helper()
	return startAloneOn(t, func(table *memTable) *memTable { return table })
}

// startAloneOn is startAlone with a's view of the table made by view: a
// table that counts, stalls or fails a's commands.
func startAloneOn[T Table](t *testing.T, view func(*memTable) T) (T, *fakeclock.Clock, *Manager) {
	t.Helper()
	table, clock := view(newMemTable()), fakeclock.New(epoch)
	a := newManager(t, table, clock, "a")
	tick(t, a)
	if n := len(holding(a)); n != events.Partitions {
		t.Fatalf("a alone holds %d partitions, want all %d", n, events.Partitions)
	}
	return table, clock, a
}

// startWithNewcomer is startAlone with a second replica, "b", on the
// same table and clock, which has run no round yet: the one that takes
// what a gives back.
func startWithNewcomer(t *testing.T) (*fakeclock.Clock, *Manager, *Manager) {
	t.Helper()
	table, clock, a := startAlone(t)
	return clock, a, newManager(t, table, clock, "b")
}

// wrote tells m how a claim's write in partitions ended (nil: it
// landed), as a claimer does while it holds the terms it wrote under.
func wrote(m *Manager, partitions []int, err error) {
	_, _, done := m.Hold()
	m.Wrote(partitions, 0, err)
	done()
}

// release gives back everything m holds, and fails the test unless m
// may claim in no partition at once, before any other replica's round.
func release(t *testing.T, m *Manager) {
	t.Helper()
	if err := m.Release(t.Context()); err != nil {
		t.Fatalf("%s: Release: %v", m.cfg.WorkerID, err)
	}
	if n := len(holding(m)); n != 0 {
		t.Errorf("%s after Release holds %d, want 0", m.cfg.WorkerID, n)
	}
}

// tickTakesAll runs a round of m, and fails the test unless m then holds
// every partition; when says at what point of the test, for the message.
func tickTakesAll(t *testing.T, m *Manager, when string) {
	t.Helper()
	tick(t, m)
	if n := len(holding(m)); n != events.Partitions {
		t.Errorf("%s %s holds %d partitions, want all %d", m.cfg.WorkerID, when, n, events.Partitions)
	}
}

func tick(t *testing.T, ms ...*Manager) {
	t.Helper()
	for _, m := range ms {
		if err := m.Tick(t.Context()); err != nil {
			t.Fatalf("%s: Tick: %v", m.cfg.WorkerID, err)
		}
	}
}

// holding returns the partitions m may claim in now.
func holding(m *Manager) map[int]bool {
	terms, _, done := m.Hold()
	defer done()
	out := map[int]bool{}
	for p, term := range terms {
		if term != 0 {
			out[p] = true
		}
	}
	return out
}

// checkDisjoint fails when two managers may claim in one partition, and
// returns how many partitions have a claimer.
func checkDisjoint(t *testing.T, ms ...*Manager) int {
	t.Helper()
	who := map[int]string{}
	for _, m := range ms {
		for p := range holding(m) {
			if other, ok := who[p]; ok {
				t.Fatalf("partition %d held by %s and %s", p, other, m.cfg.WorkerID)
			}
			who[p] = m.cfg.WorkerID
		}
	}
	return len(who)
}

func TestShare(t *testing.T) {
	t.Parallel()
	for live, want := range map[int]int{0: 64, 1: 64, 2: 32, 3: 22, 4: 16, 5: 13, 64: 1, 100: 1} {
		if got := Share(live); got != want {
			t.Errorf("Share(%d) = %d, want %d", live, got, want)
		}
	}
}

func TestJoinBalancesAndDeathIsTakenOver(t *testing.T) {
	t.Parallel()
	table, clock, a := startAlone(t)

	// b and c join: within a few rounds (well inside one term) the work
	// is split three ways and no partition ever has two claimers.
	b, c := newManager(t, table, clock, "b"), newManager(t, table, clock, "c")
	for range 4 {
		tick(t, b, c, a)
		checkDisjoint(t, a, b, c)
		clock.Advance(term / 10)
	}
	for _, m := range []*Manager{a, b, c} {
		if n := len(holding(m)); n < 20 || n > 22 {
			t.Errorf("%s holds %d partitions, want 20 to 22", m.cfg.WorkerID, n)
		}
	}
	if n := checkDisjoint(t, a, b, c); n < events.Partitions-2 {
		t.Errorf("%d partitions have a claimer, want about %d", n, events.Partitions)
	}

	// c dies (no more ticks). Its partitions stay unclaimed until its
	// terms expire, then a and b take them over.
	cHeld := holding(c)
	for i := 0; i < 12; i++ {
		clock.Advance(term / 10)
		tick(t, a, b)
		if i < 5 {
			for p := range cHeld {
				if holding(a)[p] || holding(b)[p] {
					t.Fatalf("partition %d of the dead c taken %s after its last renewal, before its term ran out", p, time.Duration(i+1)*term/10)
				}
			}
		}
	}
	if n := checkDisjoint(t, a, b); n != events.Partitions {
		t.Errorf("after c's death a and b hold %d partitions, want %d", n, events.Partitions)
	}
	// c, back from a long pause, may claim nowhere: its deadline passed.
	if n := len(holding(c)); n != 0 {
		t.Errorf("c after its terms ran out may claim in %d partitions, want 0", n)
	}
}

// TestFencingOldOwner is the interleaving of a paused owner: a holds term
// 1; time passes without a's renewal; b takes term 2; a's Hold gives
// nothing and a's renewal loses.
func TestFencingOldOwner(t *testing.T) {
	t.Parallel()
	table, clock, a := startAlone(t)
	_, validFor, done := a.Hold()
	done()
	if validFor <= 0 || validFor > term {
		t.Errorf("a may claim for %s, want within (0, %s]", validFor, term)
	}
	// a pauses past its term (a GC pause, a network partition).
	clock.Advance(term + term/5)
	if n := len(holding(a)); n != 0 {
		t.Fatalf("a past its deadline may claim in %d partitions, want 0", n)
	}
	b := newManager(t, table, clock, "b")
	tick(t, b)
	if n := len(holding(b)); n != events.Partitions {
		t.Fatalf("b holds %d partitions, want %d (a's expired)", n, events.Partitions)
	}
	// a wakes up: its round learns it lost everything, and takes nothing
	// while b's terms stand.
	tick(t, a)
	if n := len(holding(a)); n != 0 {
		t.Errorf("a after b's takeover may claim in %d partitions, want 0", n)
	}
	checkDisjoint(t, a, b)
}

// TestRenewalLostToTakeover: a's round starts before its deadline ends
// but another replica took the partition in between (a's clock ran
// slow); a's renewal insert loses and a stops claiming there.
func TestRenewalLostToTakeover(t *testing.T) {
	t.Parallel()
	table, clock, a := startAlone(t)
	// b inserts term 2 of partition 7 behind a's back.
	if won, _ := table.Insert(t.Context(), []Term{{Partition: 7, Term: 2, Owner: "b", ExpiresAt: clock.Now().Add(term)}}); !won[0] {
		t.Fatal("b's insert of term 2 lost")
	}
	clock.Advance(term / 2) // renewal due
	tick(t, a)
	if holding(a)[7] {
		t.Error("a still claims in partition 7 after b took term 2")
	}
	// b is now a live owner: a keeps its share of two replicas.
	if n := len(holding(a)); n != Share(2) {
		t.Errorf("a holds %d partitions, want %d", n, Share(2))
	}
}

func TestDatabaseOutageStopsClaiming(t *testing.T) {
	t.Parallel()
	table, clock, a := startAlone(t)
	table.mu.Lock()
	table.down = true
	table.mu.Unlock()
	clock.Advance(term / 2)
	if err := a.Tick(t.Context()); err == nil {
		t.Fatal("Tick during an outage succeeded")
	}
	if n := len(holding(a)); n != events.Partitions {
		t.Errorf("a within its term holds %d, want %d", n, events.Partitions)
	}
	clock.Advance(term / 2)
	if n := len(holding(a)); n != 0 {
		t.Errorf("a past its deadline without renewal holds %d, want 0", n)
	}
}

func TestReleaseFreesAtOnce(t *testing.T) {
	t.Parallel()
	_, a, b := startWithNewcomer(t)
	release(t, a)
	// No margin to wait: a stopped claiming before it wrote the release.
	tickTakesAll(t, b, "at once after a's release")
}

func TestPrunable(t *testing.T) {
	t.Parallel()
	now := epoch
	terms := []Term{{Partition: 1, Term: 1}, {Partition: 1, Term: 2}, {Partition: 1, Term: 3}, {Partition: 2, Term: 5}}
	members := []Member{{WorkerID: "old", SeenAt: now.Add(-time.Hour)}, {WorkerID: "new", SeenAt: now}}
	old, gone := Prunable(terms, members, now, time.Minute)
	if len(old) != 1 || old[0].ID() != "1/1" || len(gone) != 1 || gone[0] != "old" {
		t.Errorf("Prunable = %v, %v; want [1/1], [old]", old, gone)
	}
}

func TestNotReadyGivesBack(t *testing.T) {
	t.Parallel()
	table, clock := newMemTable(), fakeclock.New(epoch)
	var ready error
	a := newManagerWith(t, table, clock, Config{WorkerID: "a", Ready: func() error { return ready }})
	b := newManager(t, table, clock, "b")
	tick(t, a, b)
	clock.Advance(term / 8)
	tick(t, a, b)
	clock.Advance(term / 8)
	tick(t, a, b)
	if na, nb := len(holding(a)), len(holding(b)); na != 32 || nb != 32 {
		t.Fatalf("a holds %d, b %d; want 32 each", na, nb)
	}
	ready = context.DeadlineExceeded // a's broker is gone
	tick(t, a)
	if n := len(holding(a)); n != 0 {
		t.Errorf("a, not ready, holds %d", n)
	}
	clock.Advance(term / 8)
	tickTakesAll(t, b, "after a gave back")
	// a is back: it gets its share again.
	ready = nil
	for range 3 {
		tick(t, a, b)
		clock.Advance(term / 8)
	}
	if na, nb := len(holding(a)), len(holding(b)); na != 32 || nb != 32 {
		t.Errorf("after a is ready again: a holds %d, b %d; want 32 each", na, nb)
	}
}

// TestReleaseWaitsForClaim: a partition is not given away while a claim
// that was handed it is still running.
func TestReleaseWaitsForClaim(t *testing.T) {
	t.Parallel()
	_, _, a := startAlone(t)
	terms, _, done := a.Hold()
	if terms[0] == 0 {
		t.Fatal("a holds no partition 0")
	}
	released := make(chan error, 1)
	go func() { released <- a.Release(context.Background()) }()
	select {
	case err := <-released:
		t.Fatalf("Release returned (%v) while a claim held the partitions", err)
	case <-time.After(50 * time.Millisecond):
	}
	done()
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := len(holding(a)); n != 0 {
		t.Errorf("a holds %d after Release", n)
	}
}

// TestStaleRenewalAfterPrune: a read the renewal acted on went stale
// during a long pause, and the term it inserts was pruned under a newer
// owner; the insert wins the _id, but the later term shows it is behind,
// and the replica does not claim in the partition.
func TestStaleRenewalAfterPrune(t *testing.T) {
	t.Parallel()
	table, clock := newMemTable(), fakeclock.New(epoch)
	a := newManager(t, table, clock, "a")
	// a believes it holds term 11 of partition 7; b holds 13 and 14,
	// and 11 and 12 were pruned.
	a.owned[7] = held{term: 11, since: 11, deadline: clock.Now().Add(term / 3)}
	for _, x := range []Term{{Partition: 7, Term: 13, Owner: "b", ExpiresAt: clock.Now()}, {Partition: 7, Term: 14, Owner: "b", ExpiresAt: clock.Now().Add(term)}} {
		table.terms[x.ID()] = x
	}
	if _, err := a.renew(t.Context(), a.now()); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if _, ok := table.terms["7/12"]; !ok {
		t.Fatal("the stale renewal's insert of 7/12 did not win; the test does not test the case")
	}
	if holding(a)[7] {
		t.Error("a claims in partition 7 with term 12 while b holds term 14")
	}
}
