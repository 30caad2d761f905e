package ownership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/metrics/metricstest"
	"github.com/outboxrelay/outbox/service"
)

// readOnlyTable is a table this replica may read but not write: the
// owners collection under a role without its write privileges, or a
// quota.
type readOnlyTable struct{ *memTable }

var errNotAuthorized = errors.New("(Unauthorized) not authorized on outbox to execute command")

func (readOnlyTable) Insert(context.Context, []Term) ([]bool, error) { return nil, errNotAuthorized }
func (readOnlyTable) Heartbeat(context.Context, Member) error        { return errNotAuthorized }
func (readOnlyTable) Prune(context.Context, []Term, []string) error  { return errNotAuthorized }

// Replicas that cannot write the owners own nothing: their failed rounds
// are counted, Unowned grows past a term with the rounds' error, nobody
// leads, and after a term Leaderless says so, so that the backlog gauges
// are sampled by every replica.
func TestUnownedWhileOwnersCannotBeWritten(t *testing.T) {
	t.Parallel()
	table, clock := readOnlyTable{newMemTable()}, fakeclock.New(epoch)
	m := metrics.New(nil)
	a := newManagerWith(t, table, clock, Config{WorkerID: "a", Archetype: service.Archetype{Metrics: m}})
	b := newManagerWith(t, table, clock, Config{WorkerID: "b", Archetype: service.Archetype{Metrics: metrics.New(nil)}})

	if got := testutil.ToFloat64(m.JobErrors.WithLabelValues("ownership")); got != 0 {
		t.Fatalf("ownership errors before a round = %v, want 0", got)
	}
	rounds := 0
	for clock.Now().Sub(epoch) <= term+roundMax {
		for _, x := range []*Manager{a, b} {
			if err := x.Tick(t.Context()); !errors.Is(err, errNotAuthorized) {
				t.Fatalf("%s: Tick = %v, want the refused write", x.cfg.WorkerID, err)
			}
		}
		rounds++
		if clock.Now().Sub(epoch) <= term && a.Leaderless() {
			t.Errorf("at %s: Leaderless before a term without a leader", clock.Now().Sub(epoch))
		}
		clock.Advance(roundMax)
	}
	metricstest.Want(t, "job_errors_total{job=ownership} (every round failed)", m.JobErrors.WithLabelValues("ownership"), float64(rounds))
	metricstest.Want(t, "partitions_owned", m.PartitionsOwned, 0)
	d, err := a.Unowned()
	if d <= term || !errors.Is(err, errNotAuthorized) {
		t.Errorf("Unowned = %s, %v; want more than a term (%s) and the refused write", d, err, term)
	}
	if !a.Leaderless() || !b.Leaderless() {
		t.Errorf("Leaderless: a %t, b %t; want both after a term without a leader", a.Leaderless(), b.Leaderless())
	}
}

// A replica that owns partitions is not unowned and its rounds leave no
// error; one that owns none while another leads is unowned but not
// leaderless; and when the owner dies, Unowned of the survivor counts
// only until it takes the partitions over.
func TestUnownedAndLeaderlessFollowTheRounds(t *testing.T) {
	t.Parallel()
	a, table, clock, ma := soleOwner(t)
	if d, err := a.Unowned(); d != 0 || err != nil {
		t.Errorf("a owning every partition: Unowned = %s, %v; want 0, nil", d, err)
	}
	metricstest.Want(t, "a: partitions_owned", ma.PartitionsOwned, 64)

	// b sees a lead and takes nothing yet (a gives back only at its next
	// round): b is unowned, but a leader exists.
	b := newManagerWith(t, table, clock, Config{WorkerID: "b"})
	for range 3 * int(term/roundMax) {
		clock.Advance(roundMax)
		tick(t, b) // a is dead: it never ticks again
		if b.Leaderless() {
			t.Fatalf("at %s: b is leaderless, but a leads until its term runs out and then b does", clock.Now().Sub(epoch))
		}
	}
	if !b.Leads() {
		t.Fatal("b did not take over from the dead a")
	}
	if d, err := b.Unowned(); d != 0 || err != nil {
		t.Errorf("b after the takeover: Unowned = %s, %v; want 0, nil", d, err)
	}

	// a comes back: its deadline has long passed, so it owns nothing it
	// may claim in, and has not since its term ran out.
	// Its deadline is a term less the Margin after its insert, and it
	// claims until a Margin before that (Hold).
	sinceDeadline := clock.Now().Sub(epoch.Add(term - 2*a.cfg.Margin))
	if d, _ := a.Unowned(); d != sinceDeadline {
		t.Errorf("a, silent since its first round: Unowned = %s, want %s, the time since its deadline", d, sinceDeadline)
	}
}

// Release gives everything back and the gauge says so at once.
func TestReleaseZeroesPartitionsOwned(t *testing.T) {
	t.Parallel()
	a, _, clock, m := soleOwner(t)
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	metricstest.Want(t, "partitions_owned after Release", m.PartitionsOwned, 0)
	clock.Advance(time.Second)
	if d, _ := a.Unowned(); d != time.Second {
		t.Errorf("Unowned a second after Release = %s, want 1s", d)
	}
}

// soleOwner returns replica "a", with metrics of its own, after its first
// round on a new table, where it took every partition.
func soleOwner(t *testing.T) (*Manager, *memTable, *fakeclock.Clock, *metrics.Metrics) {
	t.Helper()
	table, clock := newMemTable(), fakeclock.New(epoch)
	m := metrics.New(nil)
	a := newManagerWith(t, table, clock, Config{WorkerID: "a", Archetype: service.Archetype{Metrics: m}})
	tick(t, a)
	return a, table, clock, m
}
