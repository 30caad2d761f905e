package ownership

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/service"
)

// A renewal keeps a partition's tenure, so that a claim whose read and
// write straddle it still writes there; Renew extends the validity a claim
// finds at once, whether or not a renewal was due.
func TestRenewKeepsTenureAndExtendsValidity(t *testing.T) {
	t.Parallel()
	_, clock, a := startAlone(t)
	before, _, done := a.Hold()
	done()
	clock.Advance(term / 2) // past two thirds of the validity: a renewal is due
	_, short, done := a.Hold()
	done()
	if err := a.Renew(t.Context()); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	after, long, done := a.Hold()
	done()
	if long <= short {
		t.Errorf("validity after Renew %s, want more than the %s before it", long, short)
	}
	if want := term - 2*a.cfg.Margin; long != want {
		t.Errorf("validity after Renew %s, want a whole term less twice the margin, %s", long, want)
	}
	for p := range before {
		if before[p] == 0 || after[p] != before[p] {
			t.Fatalf("partition %d: tenure %d before the renewal, %d after; want the same, not 0", p, before[p], after[p])
		}
	}
	tick(t, a) // the round's own renewal follows the claim's, and keeps it too
	clock.Advance(term / 2)
	tick(t, a)
	again, _, done := a.Hold()
	done()
	if again[7] != before[7] {
		t.Errorf("partition 7's tenure after a round's renewal = %d, want %d", again[7], before[7])
	}
}

// A partition lost and taken again gets a new tenure: a claim that read
// before the loss must not write in it.
func TestTenureChangesWhenAPartitionChangesHands(t *testing.T) {
	t.Parallel()
	table, clock, a := startAlone(t)
	before, _, done := a.Hold()
	done()
	// b takes term 2 of partition 7 behind a's back; it expires, and a
	// takes the partition back at term 3.
	if won, _ := table.Insert(t.Context(), []Term{{Partition: 7, Term: 2, Owner: "b", ExpiresAt: clock.Now().Add(term)}}); !won[0] {
		t.Fatal("b's insert of term 2 lost")
	}
	clock.Advance(term / 2)
	tick(t, a)
	clock.Advance(2 * term)
	tick(t, a)
	tick(t, a)
	after, _, done := a.Hold()
	done()
	if after[7] == 0 {
		t.Fatal("a did not take partition 7 back")
	}
	if after[7] == before[7] {
		t.Errorf("partition 7's tenure %d after it changed hands, want a new one", after[7])
	}
}

// Claims' Renews and a round's renewal at the same moment (rounds run one
// at a time, claims many) do not cost this replica a partition: each
// renews after the one before, instead of losing the same term's insert
// to it.
func TestConcurrentRenewalsLoseNothing(t *testing.T) {
	t.Parallel()
	_, clock, a := startAlone(t)
	clock.Advance(term / 2)
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	wg.Go(func() { errs <- a.Tick(t.Context()) })
	for range 4 {
		wg.Go(func() { errs <- a.Renew(t.Context()) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("renewal: %v", err)
		}
	}
	if n := len(holding(a)); n != 64 {
		t.Errorf("a holds %d partitions after concurrent renewals, want all 64", n)
	}
	_, valid, done := a.Hold()
	done()
	if valid <= term/2 {
		t.Errorf("validity after the renewals %s, want more than half a term", valid)
	}
}

// stallingTable never answers an insert until its context ends: a
// database that stopped answering, with the write lock held.
type stallingTable struct{ *memTable }

func (stallingTable) Insert(ctx context.Context, _ []Term) ([]bool, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// stalledAlone returns a replica that holds every partition, as
// startAlone's "a" does, on a stallingTable, and with a term of 3 s, so
// that a third of it, which bounds each write, ends soon.
func stalledAlone(t *testing.T) *Manager {
	t.Helper()
	table, clock, a := startAlone(t)
	m, err := New(stallingTable{table}, Config{WorkerID: "a", TermLength: 3 * time.Second,
		Archetype: service.Archetype{Now: clock.Now, Local: clock.Now, Logger: a.cfg.Logger}})
	if err != nil {
		t.Fatal(err)
	}
	m.owned = a.owned
	return m
}

// givesUp fails the test unless call, on a stalled database, ends with
// a deadline of its own within 30 s: the test's context has none.
func givesUp(t *testing.T, name string, call func(context.Context) error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call(t.Context()) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on a stalled database: %v, want a deadline", name, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s still waiting on a stalled database after 30 s", name)
	}
}

// No lock is held across I/O without a deadline: a release whose insert
// the database never answers gives up after a third of a term, so that the
// claims waiting on the lock go on, without the partitions it gave back.
func TestReleaseGivesUpOnAStalledDatabase(t *testing.T) {
	t.Parallel()
	m := stalledAlone(t)
	givesUp(t, "Release", m.Release)
	if n := len(holding(m)); n != 0 {
		t.Errorf("%d partitions still claimable after the release gave up, want none", n)
	}
}

// landsThenFailsTable applies the next insert and then reports it timed
// out: a write that landed after the client gave up.
type landsThenFailsTable struct {
	*memTable
	fail bool
}

func (t *landsThenFailsTable) Insert(ctx context.Context, terms []Term) ([]bool, error) {
	won, err := t.memTable.Insert(ctx, terms)
	if t.fail {
		t.fail = false
		return nil, context.DeadlineExceeded
	}
	return won, err
}

// A renewal that landed but reported a timeout does not cost the replica
// its partitions: the next renewal loses its insert to this replica's own
// term, recognises it, and keeps claiming.
func TestRenewalLandingAfterATimeoutKeepsThePartitions(t *testing.T) {
	t.Parallel()
	flaky, clock, a := startAloneOn(t, func(table *memTable) *landsThenFailsTable { return &landsThenFailsTable{memTable: table} })
	before, _, done := a.Hold()
	done()
	clock.Advance(term / 2)
	flaky.fail = true
	if err := a.Renew(t.Context()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Renew = %v, want the timeout", err)
	}
	if err := a.Renew(t.Context()); err != nil {
		t.Fatalf("Renew after the landed one: %v", err)
	}
	after, valid, done := a.Hold()
	done()
	if n := len(holding(a)); n != events.Partitions {
		t.Fatalf("a holds %d partitions after its own landed renewal, want all %d", n, events.Partitions)
	}
	if after[7] != before[7] {
		t.Errorf("partition 7's tenure %d, want %d kept", after[7], before[7])
	}
	if valid <= term/2 {
		t.Errorf("validity %s after the renewals, want more than half a term", valid)
	}
}

// A stopped Manager renews nothing for a claim: its terms are left to run
// out or be given back, as a stopped ownership loop's are.
func TestRenewAfterStopRenewsNothing(t *testing.T) {
	t.Parallel()
	table, _, a := startAlone(t)
	if err := a.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	before := len(table.terms)
	if err := a.Renew(t.Context()); !errors.Is(err, errStopped) {
		t.Errorf("Renew after Stop = %v, want errStopped", err)
	}
	if after := len(table.terms); after != before {
		t.Errorf("Renew after Stop inserted %d terms, want none", after-before)
	}
}

// A claim's Renew that waited for the lock behind another renewal renews
// nothing more: the one that just landed serves its write, and a second
// insert would only cost the claim another round trip.
func TestRenewBehindARenewalRenewsNothingMore(t *testing.T) {
	t.Parallel()
	counting, clock, a := startAloneOn(t, func(table *memTable) *countingTable { return &countingTable{memTable: table} })
	clock.Advance(term / 2)

	before := a.renewed.Load() // the claim's Renew starts here...
	tick(t, a)                 // ...while the round's renewal holds the lock
	inserts := counting.inserts
	if err := a.renewSince(t.Context(), before); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if n := counting.inserts - inserts; n != 0 {
		t.Errorf("Renew behind a renewal sent %d inserts, want none", n)
	}
	if err := a.Renew(t.Context()); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if n := counting.inserts - inserts; n != 1 {
		t.Errorf("a Renew with no renewal before it sent %d inserts, want 1", n)
	}
}

// A claim's Renew on a database that never answers gives up: it holds the
// renewal lock, and the renewals job and the rounds would wait on it for
// good.
func TestRenewGivesUpOnAStalledDatabase(t *testing.T) {
	t.Parallel()
	givesUp(t, "Renew", stalledAlone(t).Renew)
}
