package ownership

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
)

// slowTable is a shared table on which this replica's writes take time:
// each heartbeat, release insert and other insert moves the clock on by
// the time it is set to take before it lands.
type slowTable struct {
	*memTable
	clock                           *fakeclock.Clock
	read, heartbeat, release, other time.Duration
}

func (t *slowTable) Read(ctx context.Context) ([]Term, []Member, error) {
	t.clock.Advance(t.read)
	return t.memTable.Read(ctx)
}

func (t *slowTable) Heartbeat(ctx context.Context, m Member) error {
	t.clock.Advance(t.heartbeat)
	return t.memTable.Heartbeat(ctx, m)
}

func (t *slowTable) Insert(ctx context.Context, terms []Term) ([]bool, error) {
	if len(terms) > 0 && terms[0].Released {
		t.clock.Advance(t.release)
	} else {
		t.clock.Advance(t.other)
	}
	return t.memTable.Insert(ctx, terms)
}

// waitForWriter returns once a writer waits for m's lock: a round that
// blocks behind a claim's Hold. (TryRLock fails while a writer waits.)
func waitForWriter(t *testing.T, m *Manager) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.mu.TryRLock() {
		m.mu.RUnlock()
		if time.Now().After(deadline) {
			t.Fatal("the round never waited for the lock")
		}
		time.Sleep(time.Millisecond)
	}
}

// checkDeadlines fails unless every partition m holds has its deadline
// at least a Margin before the expiresAt of its term in table, with the
// server's and the local clock the same: the owner's belief ends before
// any other replica's, whose view of the term ends a Margin after it.
func checkDeadlines(t *testing.T, m *Manager, table *memTable) {
	t.Helper()
	m.mu.RLock()
	defer m.mu.RUnlock()
	table.mu.Lock()
	defer table.mu.Unlock()
	if len(m.owned) == 0 {
		t.Fatal("holds nothing: the test tests nothing")
	}
	for p, h := range m.owned {
		x, ok := table.terms[Term{Partition: p, Term: h.term}.ID()]
		if !ok {
			t.Fatalf("partition %d: term %d held but not in the table", p, h.term)
		}
		if limit := x.ExpiresAt.Add(-m.cfg.Margin); h.deadline.After(limit) {
			t.Errorf("partition %d term %d: deadline %s after the term's expiresAt less the margin (%s), by %s",
				p, h.term, h.deadline.Sub(epoch), limit.Sub(epoch), h.deadline.Sub(limit))
			return
		}
	}
}

// The owner's deadline counts from an instant no later than the one its
// terms' expiresAt was computed from, however long the round took before
// its insert: a slow heartbeat, a slow release, the write lock held by a
// claim. Before, it counted from the insert, and each of these extended
// the owner's belief past the term one for one.
func TestDeadlineCountsFromTheRoundsStart(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// heartbeat, release: how long those writes take; claim: how long
		// a claim holds the partitions once the round waits for them.
		heartbeat, release, claim, insert time.Duration
	}{
		{name: "slow heartbeat", heartbeat: 8 * time.Second},
		{name: "slow release", release: 8 * time.Second},
		{name: "write lock held by a claim", claim: 8 * time.Second},
		{name: "slow renewal insert", insert: 5 * time.Second},
		{name: "all of them", heartbeat: 4 * time.Second, release: 2 * time.Second, claim: 4 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			shared, clock := newMemTable(), fakeclock.New(epoch)
			table := &slowTable{memTable: shared, clock: clock}
			a := newManager(t, table, clock, "a")
			tick(t, a) // takes all 64 at epoch, nothing slow yet
			table.heartbeat, table.release, table.other = tc.heartbeat, tc.release, tc.insert
			// Half a term on, a renewal is due, and b's heartbeat makes a
			// give half back in the same round.
			clock.Advance(term / 2)
			if err := shared.Heartbeat(t.Context(), Member{WorkerID: "b", SeenAt: clock.Now()}); err != nil {
				t.Fatal(err)
			}
			roundStart := clock.Now()
			if tc.claim > 0 {
				_, validFor, done := a.Hold()
				if validFor < tc.claim {
					t.Fatalf("the claim's validity %s is shorter than the %s it holds the lock", validFor, tc.claim)
				}
				errc := make(chan error, 1)
				go func() { errc <- a.Tick(context.Background()) }()
				waitForWriter(t, a)
				clock.Advance(tc.claim) // the claim's write takes this long
				done()
				if err := <-errc; err != nil {
					t.Fatalf("Tick: %v", err)
				}
			} else {
				tick(t, a)
			}
			if took := clock.Now().Sub(roundStart); took < tc.heartbeat+tc.release+tc.claim+tc.insert {
				t.Fatalf("the round took %s, want the slow parts' sum", took)
			}
			if n := len(holding(a)); n != Share(2) {
				t.Fatalf("a holds %d partitions after the round, want %d", n, Share(2))
			}
			checkDeadlines(t, a, shared)
			// a stops claiming two margins before expiresAt, by the
			// instant the round started from.
			end := roundStart.Add(term - 2*a.cfg.Margin)
			if d := end.Sub(clock.Now()); d > 0 {
				clock.Advance(d - time.Millisecond)
				if n := len(holding(a)); n != Share(2) {
					t.Errorf("a holds %d partitions just before its deadline less the margin, want %d", n, Share(2))
				}
				clock.Advance(time.Millisecond)
			}
			if n := len(holding(a)); n != 0 {
				t.Errorf("a claims in %d partitions %s after its round started, want none (a term less two margins)", n, clock.Now().Sub(roundStart))
			}
		})
	}
}

// A slow round followed by the owner's death: another replica takes the
// partitions a margin after expiresAt, and at no moment may both claim
// in one partition. With the deadline counted from the insert, the 10 s
// the round spent before it (more than the three margins of slack) had
// a still claiming when b took over.
func TestSlowRoundThenTakeoverNeverOverlaps(t *testing.T) {
	t.Parallel()
	shared, clock := newMemTable(), fakeclock.New(epoch)
	table := &slowTable{memTable: shared, clock: clock}
	a := newManager(t, table, clock, "a")
	b := newManager(t, shared, clock, "b")
	tick(t, a)
	clock.Advance(term / 2)
	table.heartbeat = 3 * time.Second
	_, _, done := a.Hold()
	errc := make(chan error, 1)
	go func() { errc <- a.Tick(context.Background()) }()
	waitForWriter(t, a)
	clock.Advance(7 * time.Second)
	done()
	if err := <-errc; err != nil {
		t.Fatalf("Tick: %v", err)
	}
	checkDeadlines(t, a, shared)
	// a dies; b runs its rounds every 100 ms until it holds everything.
	for i := 0; len(holding(b)) < events.Partitions; i++ {
		if i > int(3*term/(100*time.Millisecond)) {
			t.Fatalf("b holds %d partitions after %s, want all", len(holding(b)), clock.Now().Sub(epoch))
		}
		tick(t, b)
		checkDisjoint(t, a, b)
		clock.Advance(100 * time.Millisecond)
	}
}

// Renew reads the server's time itself, just before its insert, and the
// new deadlines count from the local instant read with it, not from the
// insert's reply.
func TestRenewCountsFromItsOwnReading(t *testing.T) {
	t.Parallel()
	shared, clock := newMemTable(), fakeclock.New(epoch)
	table := &slowTable{memTable: shared, clock: clock}
	a := newManager(t, table, clock, "a")
	tick(t, a)
	clock.Advance(term / 2)
	table.other = 5 * time.Second
	before := clock.Now()
	if err := a.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	checkDeadlines(t, a, shared)
	_, validFor, done := a.Hold()
	done()
	if want := before.Add(term - 2*a.cfg.Margin).Sub(clock.Now()); validFor != want {
		t.Errorf("validity after a renewal whose insert took 5 s = %s, want %s", validFor, want)
	}
}

// No partition is taken before the server's time has been measured: a
// round until then fails with ErrClockUnsynced, writes nothing and holds
// nothing; the first round after the measurement takes the share.
func TestNoPartitionBeforeTheClockSyncs(t *testing.T) {
	t.Parallel()
	table, clock := newMemTable(), fakeclock.New(epoch)
	synced := false
	a := newManagerWith(t, table, clock, Config{WorkerID: "a", Synced: func() bool { return synced }})
	for range 3 {
		if err := a.Tick(t.Context()); !errors.Is(err, ErrClockUnsynced) {
			t.Fatalf("Tick before the clock synced = %v, want ErrClockUnsynced", err)
		}
		clock.Advance(roundMax)
	}
	if err := a.Renew(t.Context()); !errors.Is(err, ErrClockUnsynced) {
		t.Errorf("Renew before the clock synced = %v, want ErrClockUnsynced", err)
	}
	if n := len(holding(a)); n != 0 {
		t.Errorf("a holds %d partitions before the clock synced, want 0", n)
	}
	if len(table.terms) != 0 || len(table.members) != 0 {
		t.Errorf("the table has %d terms and %d members before the clock synced, want none", len(table.terms), len(table.members))
	}
	if _, err := a.Unowned(); !errors.Is(err, ErrClockUnsynced) {
		t.Errorf("Unowned's error = %v, want ErrClockUnsynced: readiness says why", err)
	}
	synced = true
	tickTakesAll(t, a, "once the clock synced")
}

// A round renews before it reads the owners and writes its heartbeat:
// those round trips come off no term. Through a slow database, the read
// and the heartbeat ahead of the renewal let terms run out before they
// were renewed, and the partitions lapsed.
func TestRenewalComesBeforeTheRead(t *testing.T) {
	t.Parallel()
	shared, clock := newMemTable(), fakeclock.New(epoch)
	table := &slowTable{memTable: shared, clock: clock}
	a := newManager(t, table, clock, "a")
	tick(t, a) // takes all 64 at epoch
	// Renewal is due, with 0.4 of a term left to the deadline, and the
	// heartbeat takes longer than that.
	clock.Advance(term / 2)
	table.heartbeat = term / 2
	roundStart := clock.Now()
	tick(t, a)
	if n := len(holding(a)); n != 64 {
		t.Fatalf("a holds %d partitions after a round whose heartbeat took the term's rest, want all 64", n)
	}
	checkDeadlines(t, a, shared)
	a.mu.RLock()
	defer a.mu.RUnlock()
	for p, h := range a.owned {
		if want := roundStart.Add(term - a.cfg.Margin); !h.deadline.Equal(want) {
			t.Fatalf("partition %d: deadline %s, want a term less the margin from the round's start (%s)", p, h.deadline.Sub(epoch), want.Sub(epoch))
		}
	}
}

// blockingTable holds the first Read after block is set until the test
// lets it go: a round stuck on a slow database.
type blockingTable struct {
	*memTable
	block   atomic.Bool
	reading chan struct{} // closed once a read blocks
	release chan struct{} // closed: the blocked read goes on
}

func (t *blockingTable) Read(ctx context.Context) ([]Term, []Member, error) {
	if t.block.CompareAndSwap(true, false) {
		close(t.reading)
		<-t.release
	}
	return t.memTable.Read(ctx)
}

// A renewal does not wait for the round: while a round is stuck on its
// read, the renewals job renews the partitions once due, and they stay
// held. Before, a renewal ran only at the start of a round, so a round
// that took longer than the rest of a term let every partition lapse.
func TestRenewalDoesNotWaitForASlowRound(t *testing.T) {
	t.Parallel()
	shared, clock := newMemTable(), fakeclock.New(epoch)
	table := &blockingTable{memTable: shared, reading: make(chan struct{}), release: make(chan struct{})}
	a := newManager(t, table, clock, "a")
	tick(t, a) // takes all 64 at epoch

	table.block.Store(true)
	round := make(chan error, 1)
	go func() { round <- a.Tick(t.Context()) }()
	<-table.reading // the round is stuck on its read; no renewal was due

	clock.Advance(term / 2)
	renewedAt := clock.Now()
	if _, err := a.renewalRun(t.Context()); err != nil {
		t.Fatalf("renewalRun: %v", err)
	}
	clock.Advance(term / 2) // past the first terms' deadlines
	if n := len(holding(a)); n != events.Partitions {
		t.Errorf("a holds %d partitions a term after taking them, while its round was stuck; want all %d renewed", n, events.Partitions)
	}
	a.mu.RLock()
	for p, h := range a.owned {
		if want := renewedAt.Add(term - a.cfg.Margin); !h.deadline.Equal(want) {
			t.Errorf("partition %d: deadline %s, want a term less the margin from the renewal (%s)", p, h.deadline.Sub(epoch), want.Sub(epoch))
			break
		}
	}
	a.mu.RUnlock()
	checkDeadlines(t, a, shared)

	close(table.release)
	if err := <-round; err != nil {
		t.Fatalf("the stuck round: %v", err)
	}
}
