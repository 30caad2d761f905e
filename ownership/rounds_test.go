package ownership

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/fakeclock"
)

// countingTable is one replica's view of a shared table that counts the
// reads, inserts, heartbeats and prunes that replica sends.
type countingTable struct {
	*memTable
	reads, inserts, heartbeats, prunes int
}

func (t *countingTable) Read(ctx context.Context) ([]Term, []Member, error) {
	t.reads++
	return t.memTable.Read(ctx)
}

func (t *countingTable) Insert(ctx context.Context, terms []Term) ([]bool, error) {
	t.inserts++
	return t.memTable.Insert(ctx, terms)
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
	for range 4 { // a gives back half, b takes it
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
	// An owner's heartbeat rides on its renewals: at most one a third of
	// a term, and at least one a term, for the others to count it live.
	if got := ta.heartbeats - beats; got > 3*terms || got < terms {
		t.Errorf("heartbeats of a over %d rounds (%d terms): %d, want %d to %d", rounds, terms, got, terms, 3*terms)
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

// scheduled runs what the schedule runs at each tick: a round, unless the
// manager rests.
func scheduled(t *testing.T, ms ...*Manager) {
	t.Helper()
	for _, m := range ms {
		if !m.rest() {
			tick(t, m)
		}
	}
}

// balanced returns replicas a and b on a shared table, each with half the
// partitions, and their counting views of it.
func balanced(t *testing.T) (*fakeclock.Clock, *memTable, [2]*Manager, [2]*countingTable) {
	t.Helper()
	shared, clock := newMemTable(), fakeclock.New(epoch)
	ta, tb := &countingTable{memTable: shared}, &countingTable{memTable: shared}
	a, b := newManager(t, ta, clock, "a"), newManager(t, tb, clock, "b")
	for range 4 {
		scheduled(t, a, b)
		clock.Advance(roundMax)
	}
	if got := checkDisjoint(t, a, b); got != 64 {
		t.Fatalf("owned after balancing: %d partitions, want 64", got)
	}
	return clock, shared, [2]*Manager{a, b}, [2]*countingTable{ta, tb}
}

// Once the shares hold still, scheduled rounds are left out, doubling up
// to quietMax apart, while heartbeats and renewals still run on time: the
// replicas keep their shares throughout.
func TestSettledReplicasRest(t *testing.T) {
	t.Parallel()
	clock, _, ms, tables := balanced(t)
	a, b := ms[0], ms[1]
	reads, inserts, beats := tables[0].reads, tables[0].inserts, tables[0].heartbeats

	const terms = 3
	ticks := int(terms * term / roundMax)
	for range ticks {
		clock.Advance(roundMax)
		scheduled(t, a, b)
		if n, m := len(holding(a)), len(holding(b)); n != 32 || m != 32 {
			t.Fatalf("a holds %d, b %d partitions at %s, want 32 each", n, m, clock.Now().Sub(epoch))
		}
	}
	// A round is one read, and a renewal one more to check what it won
	// (see insert); renewals come on time, the other ticks mostly rest.
	rounds := tables[0].reads - reads - (tables[0].inserts - inserts)
	if rounds >= ticks/2 {
		t.Errorf("a ran %d rounds in %d ticks of settled shares; want under half", rounds, ticks)
	}
	if got := tables[0].heartbeats - beats; got > 3*terms || got < terms {
		t.Errorf("heartbeats of a over %d terms: %d, want %d to %d", terms, got, terms, 3*terms)
	}
}

// A replica that joins settled replicas gets its share within quietMax
// and a few rounds: its heartbeat changes the count of live replicas,
// which brings the others back to a round each tick.
func TestRestingReplicasMakeRoomForAJoiner(t *testing.T) {
	t.Parallel()
	clock, shared, ms, _ := balanced(t)
	a, b := ms[0], ms[1]
	for range 3 * int(quietMax/roundMax) { // long enough to rest the most
		clock.Advance(roundMax)
		scheduled(t, a, b)
	}
	if a.quiet == 0 || b.quiet == 0 {
		t.Fatalf("a and b not resting after settling (quiet %d and %d)", a.quiet, b.quiet)
	}

	c := newManager(t, shared, clock, "c")
	joined := clock.Now()
	least := events.Partitions - 2*Share(3) // a and b keep their share
	for clock.Now().Sub(joined) <= quietMax+6*roundMax {
		scheduled(t, a, b, c)
		if checkDisjoint(t, a, b, c) == 64 && len(holding(c)) >= least {
			t.Logf("c holds its share %s after joining", clock.Now().Sub(joined))
			return
		}
		clock.Advance(roundMax)
	}
	t.Fatalf("c holds %d partitions %s after joining, want at least %d of 64 held", len(holding(c)), clock.Now().Sub(joined), least)
}

// Partitions taken in different rounds are renewed together, in one
// insert, rather than each group on its own schedule.
func TestPartitionsTakenApartRenewTogether(t *testing.T) {
	t.Parallel()
	shared, clock := newMemTable(), fakeclock.New(epoch)
	ta := &countingTable{memTable: shared}
	a, b := newManager(t, ta, clock, "a"), newManager(t, shared, clock, "b")
	for range 4 { // a and b split the partitions
		tick(t, a, b)
		clock.Advance(roundMax)
	}
	// b stops cleanly; a takes b's half off the beat of its own renewals.
	if err := b.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(roundMax / 2)
	for range 4 {
		tick(t, a)
		clock.Advance(roundMax)
	}
	if n := len(holding(a)); n != 64 {
		t.Fatalf("a holds %d partitions after b left, want 64", n)
	}

	inserts := ta.inserts
	const terms = 3
	for range int(terms * term / roundMax) {
		clock.Advance(roundMax)
		tick(t, a)
	}
	// A renewal is due a third of a term after the last: one insert each
	// period, not one for each half.
	period := term / 3
	if got, want := ta.inserts-inserts, int(terms*term/period)+1; got > want {
		t.Errorf("a sent %d inserts in %d terms, want at most %d: its two halves renewed apart", got, terms, want)
	}
}

// However the rounds rest, a claim starting just before a renewal still
// gets two thirds of a term, less a tick and two Margins (the renewal's
// and Hold's), for its writes: the validity Hold reports never falls below
// that.
func TestRenewalsLeaveClaimsTheirValidity(t *testing.T) {
	t.Parallel()
	clock, _, ms, _ := balanced(t)
	a := ms[0]
	floor := 2*term/3 - a.every - 2*a.cfg.Margin
	least := term
	for range int(3 * term / a.every) {
		_, validFor, done := a.Hold()
		done()
		least = min(least, validFor)
		clock.Advance(a.every)
		scheduled(t, ms[0], ms[1])
	}
	if least < floor {
		t.Errorf("least validity a claim got over 3 terms: %s, want at least %s", least, floor)
	}
}

// pruneDeadlines records how far off the deadline of each Prune was.
type pruneDeadlines struct {
	*memTable
	left []time.Duration
}

func (t *pruneDeadlines) Prune(ctx context.Context, terms []Term, members []string) error {
	d, _ := ctx.Deadline()
	t.left = append(t.left, time.Until(d))
	return t.memTable.Prune(ctx, terms, members)
}

// The prune of old terms gets a third of a term of its own, not what is
// left of its round's: through a slow database the round's was spent by
// then, every prune failed at once, and old terms piled up in every read
// of the owners.
func TestPruneHasADeadlineOfItsOwn(t *testing.T) {
	t.Parallel()
	table, clock, a := startAloneOn(t, func(table *memTable) *pruneDeadlines { return &pruneDeadlines{memTable: table} })
	for range int(3 * term / roundMax) {
		clock.Advance(roundMax)
		tick(t, a)
	}
	if len(table.left) == 0 {
		t.Fatal("no prune over 3 terms of renewals; the test does not test the case")
	}
	for _, left := range table.left {
		if left > term/3 || left < term/3-5*time.Second {
			t.Errorf("a prune had %s left of its deadline, want about a third of a term (%s) of its own", left, term/3)
		}
	}
}

// With long terms (a long stale threshold) a settled replica's rounds
// rest until a third of a term, the renewals' period, rather than
// quietMax: an idle outbox's owners are read with its renewals.
func TestLongTermsRestLonger(t *testing.T) {
	t.Parallel()
	const long = 10 * time.Minute
	shared, clock := newMemTable(), fakeclock.New(epoch)
	table := &countingTable{memTable: shared}
	cfg := Config{WorkerID: "a", TermLength: long}
	cfg.Now, cfg.Local, cfg.Logger = clock.Now, clock.Now, slog.New(slog.DiscardHandler)
	m, err := New(table, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 8 { // take every partition and settle
		scheduled(t, m)
		clock.Advance(m.every)
	}
	reads, inserts := table.reads, table.inserts
	const span = 3 * long
	for clock.Advance(m.every); clock.Now().Sub(epoch) < span; clock.Advance(m.every) {
		scheduled(t, m)
		if n := len(holding(m)); n != events.Partitions {
			t.Fatalf("a holds %d partitions at %s, want all %d", n, clock.Now().Sub(epoch), events.Partitions)
		}
	}
	// A round is one read, and a renewal one more (see insert).
	rounds := (table.reads - reads) - (table.inserts - inserts)
	if most := int(span / (long / 3) * 2); rounds > most {
		t.Errorf("%d rounds in %s of settled shares with %s terms, want at most %d (%d at quietMax apart)",
			rounds, span, long, most, int(span/quietMax))
	}
}
