package ownership

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/schedule"
	"github.com/outboxrelay/outbox/service"
)

const (
	// MarginDivisorDefault makes Margin default to TermLength divided by it.
	MarginDivisorDefault = 10
	// memberForget is how many term lengths a silent member's heartbeat
	// is kept before Prune deletes it.
	memberForget = 10
)

// Config configures a Manager.
type Config struct {
	// WorkerID names this replica on its terms. Required.
	WorkerID string
	// TermLength is how long a term lasts: a dead replica's partitions
	// are free this long (plus Margin) after its last renewal. The worker
	// uses half of OUTBOX_STALE_AFTER. Required.
	TermLength time.Duration
	// Margin is subtracted from an owner's own deadline and added to
	// others' view of a term's expiry: it covers the uncertainty of the
	// server clock's offset and one claim's duration. Defaults to
	// TermLength / MarginDivisorDefault (a tenth).
	Margin time.Duration
	// Archetype is the logger, the metrics and the clocks: Now is the
	// database server's time, which terms are written in; an owner
	// measures its deadline on Local. Metrics receives the failed rounds
	// (job_errors_total{job="ownership"}) and the partitions owned.
	service.Archetype
	// Synced, when set, says whether Now is the server's time yet
	// (mongo.Clock's Synced): until it is, Now is this machine's clock,
	// and a round takes, renews and announces nothing (it fails with
	// ErrClockUnsynced). Defaults to nil: Now is always the server's.
	Synced func() bool
	// Ready, when set, says whether this replica can publish now (the
	// broker's Ready). A replica that cannot gives its partitions back
	// and withdraws its heartbeat, so that the others take its share
	// instead of leaving it waiting. Defaults to nil: always ready.
	Ready func() error
	// OnLead, when set, is called after a round in which this replica
	// became the leader (Leads), so that the work one replica does for
	// all of them starts at once instead of at its next tick.
	OnLead func()
	// OnTake, when set, is called after a round in which this replica
	// took partitions, so that it claims in them at once (after a start,
	// a takeover or a rebalance) instead of at its next claim tick.
	OnTake func()
}

func (c *Config) setDefaults() {
	c.Margin = cmp.Or(c.Margin, c.TermLength/MarginDivisorDefault)
	c.Archetype = c.Archetype.WithDefaults()
}

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	return rule.First("ownership",
		rule.Required("WorkerID", c.WorkerID != ""),
		rule.Above("TermLength", c.TermLength, 0),
		rule.Check("Margin", c.Margin >= 0 && 3*c.Margin < c.TermLength, c.Margin,
			fmt.Sprintf("0 to under a third of TermLength (%s)", c.TermLength)),
	)
}

// ErrClockUnsynced is a round's error while the server's time has not been
// measured (Config.Synced): no partition is taken on this machine's clock.
var ErrClockUnsynced = errors.New("the database server's time is not measured yet; no partition is taken until it is")

// Manager takes, renews, balances and gives back partitions for one
// replica. Tick runs one round; Start runs it every third of a term and
// at least every roundMax, leaving rounds out while the shares hold still
// (see quietMax).
type Manager struct {
	cfg   Config
	table Table
	job   *schedule.Job
	// renewals renews on a schedule of its own (see renewalRun), so that
	// a slow round (a read, a heartbeat, takes, each a round trip) never
	// holds a renewal back past its partitions' deadlines.
	renewals *schedule.Job
	// renewedBeat is set by a renewal of the renewals job: the round
	// writes the heartbeat that goes with it (heartbeatDue).
	renewedBeat atomic.Bool
	// renewed counts the renewals that succeeded: a Renew that waited
	// for the lock behind one (see Renew) renews nothing more.
	renewed atomic.Int64

	// mu is held for reading by a claim (Hold) and for writing while a
	// partition is given away, so that no claim runs in a partition after
	// its release was written.
	mu    sync.RWMutex
	owned map[int]held
	// renewing serializes renewals: a round's and a claim's (Renew) would
	// otherwise insert the same next term, and the loser would forget a
	// partition it still owns.
	renewing sync.Mutex
	// stopped is set by Stop: a claim's Renew renews nothing after it.
	stopped atomic.Bool

	// beatAt is the server time of the last heartbeat written, and led
	// whether the last round ended with this replica the leader. quiet
	// counts the rounds in a row that changed nothing, live how many
	// replicas the last round counted, and rested the scheduled rounds
	// left out since the last one run; prunable is what the last round
	// found to delete (see prune). Rounds run one at a time, so none of
	// them needs a lock.
	beatAt   time.Time
	led      bool
	prunable prunable
	quiet    int
	live     int
	rested   int

	// every is the schedule's tick.
	every time.Duration

	// notes is what the claims (Wrote) and the server clock
	// (ClockJumped) reported (reports.go).
	notes notes

	// health is what /readyz, /status and the sampler learn from the
	// rounds: when this replica last held a partition, when a round last
	// saw a leader, and the last round's error (health.go).
	health health
}

// New returns a Manager; Start runs it.
func New(table Table, cfg Config) (*Manager, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, table: table, owned: map[int]held{}, every: max(min(cfg.TermLength/3, roundMax), time.Millisecond)}
	m.health.epoch = cfg.Local()
	var err error
	if m.job, err = schedule.New(schedule.Config{Name: "ownership", Schedule: fmt.Sprintf("@every %s", m.every), RunAtStart: true, Logger: cfg.Logger,
		Run: func(ctx context.Context) (bool, error) {
			if m.rest() {
				return false, nil
			}
			return false, m.Tick(ctx)
		},
	}); err != nil {
		return nil, err
	}
	if m.renewals, err = schedule.New(schedule.Config{Name: "ownership", Schedule: fmt.Sprintf("@every %s", m.every/renewalChecks), Logger: cfg.Logger,
		Run: m.renewalRun,
	}); err != nil {
		return nil, err
	}
	return m, nil
}

// Start runs a first Tick at once, then one every third of a term and at
// least every roundMax while the shares move (see quietMax).
func (m *Manager) Start(ctx context.Context) error {
	if err := m.job.Start(ctx); err != nil {
		return err
	}
	return m.renewals.Start(ctx)
}

// Stop ends the ticks. The terms it holds expire on their own; Release
// gives them back at once. Idempotent; safe before Start.
func (m *Manager) Stop(ctx context.Context) error {
	m.stopped.Store(true)
	return errors.Join(m.renewals.Stop(ctx), m.job.Stop(ctx))
}

// Owned returns the partitions this replica holds, ascending.
func (m *Manager) Owned() []int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]int, 0, len(m.owned))
	for p := range m.owned {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
