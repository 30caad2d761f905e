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

	"github.com/outboxrelay/outbox/events"
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

// held is a partition this replica owns.
type held struct {
	term int64
	// since is the term this replica's unbroken ownership began with: a
	// renewal keeps it, a partition lost and taken again gets a new one.
	// Hold returns it, so that a claim whose read and write straddle a
	// renewal still writes in the partition.
	since int64
	// deadline is when this replica stops claiming in it, on Local: a
	// term less the Margin after the local instant read together with the
	// server time its expiresAt was computed from (see instant).
	deadline time.Time
}

// instant is one moment read on both clocks, the local one first: the
// server time a term's expiresAt is computed from, and a local instant no
// later than it, which the owner's deadline counts from. Whatever happens
// between it and the insert (the heartbeat, waiting for the write lock
// behind a claim, a release, a slow database) shortens the owner's
// validity instead of extending its belief past expiresAt.
type instant struct{ local, server time.Time }

// now reads the instant.
func (m *Manager) now() instant {
	local := m.cfg.Local()
	return instant{local: local, server: m.cfg.Now()}
}

// ErrClockUnsynced is a round's error while the server's time has not been
// measured (Config.Synced): no partition is taken on this machine's clock.
var ErrClockUnsynced = errors.New("the database server's time is not measured yet; no partition is taken until it is")

// roundMax bounds the time between two rounds while the shares move.
// Balancing moves only at rounds: a replica that joins gets its share
// within a few of them, not within two thirds of a term (20 s at the
// default stale threshold), during which it would only poll. A round costs
// one command (read the owners) unless a heartbeat, a renewal or a prune
// is due.
const roundMax = 2 * time.Second

// quietMax bounds the time between two reads of the owners once the
// shares hold still. Each round that changes nothing doubles the number of
// scheduled rounds that are left out, up to this; a change anywhere (a
// member joins or goes silent, a partition is free, taken or given back)
// brings the next round back to every tick. A heartbeat or a renewal that
// falls due runs its round on time regardless. Idle replicas then read the
// owners every 8 s rather than every 2 s, and a replica that joins waits
// for its share up to this much longer.
const quietMax = 8 * time.Second

// quietShiftMax caps the doubling, whatever the tick.
const quietShiftMax = 8

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

// renewalChecks is how many times per round the renewals job checks
// whether a renewal is due: a check is local, and the finer they come the
// sooner after it falls due a renewal starts.
const renewalChecks = 4

// renewalRun renews the partitions held once a renewal is due, apart from
// the rounds. Through a slow database a round's read, heartbeat and takes
// each cost a round trip, and a renewal that waited for the round let
// terms run out: with commands at a tenth of a term, a round that ran a
// third of a term over put the renewal past the deadline. On its own
// schedule a renewal waits for nothing but its own insert and check read.
// A failed renewal is counted with the rounds' errors; the next check
// tries again.
func (m *Manager) renewalRun(ctx context.Context) (bool, error) {
	if m.stopped.Load() || !m.renewalDue() {
		return false, nil
	}
	if m.cfg.Synced != nil && !m.cfg.Synced() {
		return false, nil // the round reports it
	}
	// Past two thirds of a term the partitions' deadlines have passed:
	// the round takes them again, if still free.
	ctx, cancel := context.WithTimeout(ctx, 2*m.cfg.TermLength/3)
	defer cancel()
	renewed, err := m.renew(ctx, m.now())
	if err != nil && !errors.Is(err, context.Canceled) {
		m.cfg.Metrics.JobErrors.WithLabelValues("ownership").Inc()
		return false, err
	}
	if renewed {
		m.renewedBeat.Store(true)
	}
	return false, nil
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

// errStopped is Renew's answer once the Manager is stopping: its terms
// are left to run out or be released, not renewed.
var errStopped = errors.New("ownership stopped")

// Hold returns the tenure of each partition this replica may claim in now
// (Partitions entries, 0 where it may not): the term its unbroken
// ownership began with, which renewals keep. It also returns how long it
// may claim in all of them, and a function to call once the claim's writes
// are done: no partition is given away in between. A partition whose
// deadline is less than Margin away is not returned. A partition whose
// tenure differs between two Holds changed hands in between.
func (m *Manager) Hold() (terms []int64, validFor time.Duration, done func()) {
	m.mu.RLock()
	now := m.cfg.Local()
	terms = make([]int64, events.Partitions)
	validFor = -1
	for p, h := range m.owned {
		left := h.deadline.Sub(now) - m.cfg.Margin
		if left <= 0 {
			continue
		}
		terms[p] = h.since
		if validFor < 0 || left < validFor {
			validFor = left
		}
	}
	return terms, max(validFor, 0), m.mu.RUnlock
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

// Tick runs one round: renew what is due, read the owners, heartbeat,
// drop what was lost or ran out, give back the excess over the share,
// take free partitions up to the share, prune old terms. A round that fails is counted
// (job_errors_total{job="ownership"}) and kept for Unowned.
func (m *Manager) Tick(ctx context.Context) error {
	// A round is worth nothing once the terms it would renew have run
	// out: it gives up after a term rather than wait on a database that
	// stopped answering.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, m.cfg.TermLength)
	defer cancel()
	err := m.round(ctx)
	cancel()
	if err == nil {
		m.prune(parent)
	}
	m.noteRound(err)
	return err
}

// prunable are the old terms and silent members a round found to delete.
type prunable struct {
	old  []Term
	gone []string
}

// prune deletes what the last round found prunable, with a deadline of
// its own, a third of a term: at the end of a round slowed by the
// database it got what was left of the round's (often nothing, "server-
// side timeout 0 ms"), old terms piled up, and every read of the owners,
// renewals' check reads included, grew slower for it.
func (m *Manager) prune(ctx context.Context) {
	p := m.prunable
	m.prunable = prunable{}
	if len(p.old)+len(p.gone) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.TermLength/3)
	defer cancel()
	if err := m.table.Prune(ctx, p.old, p.gone); err != nil {
		m.cfg.Logger.Warn("old ownership terms not deleted; the next round tries again", "error", err)
	}
}

// round is one round of Tick.
func (m *Manager) round(ctx context.Context) error {
	me := m.cfg.WorkerID
	if m.cfg.Synced != nil && !m.cfg.Synced() {
		return ErrClockUnsynced
	}
	if m.cfg.Ready != nil {
		if why := m.cfg.Ready(); why != nil {
			if len(m.Owned()) > 0 {
				m.cfg.Logger.Warn("giving partitions back while this worker cannot publish", "error", why)
			}
			return m.Release(ctx)
		}
	}
	// The renewal first: it needs nothing the read brings (a partition
	// another replica took meanwhile is a duplicate key), and every round
	// trip before it comes off the validity the claims get. Through a
	// slow database the read and the heartbeat ahead of it let terms run
	// out before their renewal.
	renewed, err := m.renew(ctx, m.now())
	if err != nil {
		return err
	}
	// The heartbeat goes beside the read: it needs nothing the read
	// brings (Live counts this replica whatever the members say), and
	// through a slow database every round trip in a row before the takes
	// comes off the validity of the terms they take.
	beat := make(chan error, 1)
	beatRenewed := renewed || m.renewedBeat.Load()
	go func() { beat <- m.heartbeat(ctx, m.now().server, beatRenewed) }()
	terms, members, err := m.table.Read(ctx)
	beatErr := <-beat
	if err != nil {
		return fmt.Errorf("read owners: %w", err)
	}
	at := m.now()
	serverNow := at.server
	latest := Latest(terms)
	// Before any write fails the round: a replica that cannot write the
	// owners still learns whether some other one leads.
	m.noteLeader(latest, serverNow)
	if beatErr != nil {
		return beatErr
	}

	m.mu.Lock()
	m.dropLost(latest)
	live := Live(me, latest, members, serverNow, m.cfg.TermLength, m.cfg.Margin)
	share := Share(live)
	excess := m.excess(share)
	m.mu.Unlock()
	quiet := m.quiet
	m.quiet, m.rested = 0, 0 // until this round is known to have changed nothing
	if len(excess) > 0 {
		if err := m.release(ctx, excess, serverNow); err != nil {
			return err
		}
	}
	took, err := m.take(ctx, latest, share, at)
	if err != nil {
		return err
	}
	if len(excess) == 0 && took == 0 && live == m.live && !anyFree(latest, serverNow, m.cfg.Margin) {
		m.quiet = min(quiet+1, quietShiftMax)
	}
	m.live = live
	lead := m.Leads()
	// The leader prunes for all: any replica could, from the same read,
	// but every one of them sending the same delete after each renewal
	// only multiplied the commands.
	if old, gone := Prunable(terms, members, serverNow, memberForget*m.cfg.TermLength); lead && len(old)+len(gone) > 0 {
		m.prunable = prunable{old: old, gone: gone}
	}
	if lead && !m.led && m.cfg.OnLead != nil {
		m.cfg.OnLead()
	}
	m.led = lead
	if took > 0 && m.cfg.OnTake != nil {
		m.cfg.OnTake()
	}
	return nil
}

// LeaderPartition is the partition whose owner is the leader: the one
// replica that does the work done once for all of them (pruning old
// terms here, sampling the backlog gauges in the worker). Leadership moves with the partition, by the same
// unique inserts, so at most one replica leads at a time.
const LeaderPartition = 0

// Leads reports whether this replica is the leader now: it may claim in
// LeaderPartition.
func (m *Manager) Leads() bool {
	terms, _, done := m.Hold()
	defer done()
	return terms[LeaderPartition] != 0
}

// heartbeat tells the others this replica is alive, once a third of a
// term (see heartbeatDue): a member counts as live for a term after its
// last heartbeat (Live), so the rounds in between need not write one.
func (m *Manager) heartbeat(ctx context.Context, serverNow time.Time, renewed bool) error {
	if !m.heartbeatDue(serverNow, renewed) {
		return nil
	}
	if err := m.table.Heartbeat(ctx, Member{WorkerID: m.cfg.WorkerID, SeenAt: serverNow}); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	m.beatAt = serverNow
	m.renewedBeat.Store(false)
	return nil
}

// dropLost forgets partitions whose latest term is someone else's, or
// whose deadline has passed, with one warning for each kind: a slow
// database lets every partition lapse at once, and 64 lines of it bury
// everything else. Call with mu held.
func (m *Manager) dropLost(latest map[int]Term) {
	now := m.cfg.Local()
	var taken, lapsed []int
	for p, h := range m.owned {
		t, ok := latest[p]
		switch {
		case ok && t.Term > h.term && t.Owner != m.cfg.WorkerID:
			taken = append(taken, p)
		case !h.deadline.After(now):
			lapsed = append(lapsed, p)
		default:
			continue
		}
		m.sawHeld(m.claimsUntil(h, now))
		delete(m.owned, p)
	}
	if len(taken) > 0 {
		slices.Sort(taken)
		m.cfg.Logger.Warn("partitions taken over by another worker", "count", len(taken), "partitions", taken)
	}
	if len(lapsed) > 0 {
		slices.Sort(lapsed)
		m.cfg.Logger.Warn("partitions' terms ran out before their renewal; claiming in them stopped", "count", len(lapsed), "partitions", lapsed)
	}
}

// excess picks the partitions over share to give back: the highest ones.
// Call with mu held.
func (m *Manager) excess(share int) []int {
	if len(m.owned) <= share {
		return nil
	}
	ps := make([]int, 0, len(m.owned))
	for p := range m.owned {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps[share:]
}

// release gives partitions back by inserting their next term, expired as
// it is written. The write lock keeps claims out until the partitions are
// no longer this replica's. A release that loses means the partition was
// already taken.
func (m *Manager) release(ctx context.Context, ps []int, serverNow time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	terms := make([]Term, 0, len(ps))
	for _, p := range ps {
		if h, ok := m.owned[p]; ok {
			terms = append(terms, Term{Partition: p, Term: h.term + 1, Owner: m.cfg.WorkerID, ExpiresAt: serverNow, Released: true})
			m.sawHeld(m.claimsUntil(h, m.cfg.Local()))
			delete(m.owned, p)
		}
	}
	if len(terms) == 0 {
		return nil
	}
	// Claims wait on the lock (Hold): the insert gets a deadline, a third
	// of a term. A release that gives up is safe, only slower to hand the
	// partitions over.
	ctx, cancel := context.WithTimeout(ctx, m.cfg.TermLength/3)
	defer cancel()
	if _, err := m.table.Insert(ctx, terms); err != nil {
		// Not claimed in any more either way; the terms expire.
		return fmt.Errorf("give back %d partitions: %w", len(terms), err)
	}
	m.cfg.Logger.Info("partitions given back to balance the replicas", "partitions", len(terms))
	return nil
}

// renew inserts the next term of every partition held once any of them is
// less than two thirds of a term from its deadline (see renewalDue). They
// are renewed together so that their deadlines stay together: partitions
// taken in different rounds would otherwise each cost an insert, and its
// check read, on a schedule of their own.
func (m *Manager) renew(ctx context.Context, at instant) (renewed bool, err error) {
	m.renewing.Lock()
	defer m.renewing.Unlock()
	if !m.renewalDue() {
		return false, nil
	}
	return true, m.renewHeld(ctx, at)
}

// Renew renews every partition held now, due or not: for a claim whose
// write needs more time than Hold has left (see the claim package). The
// new terms run from the server's time as this call reads it. Call it
// without a Hold in progress: the insert takes the write lock. The new
// deadlines count from the local instant read together with that server
// time, just before the insert.
//
// A renewal that succeeded while Renew waited for another's to end (the
// renewals job's, or a round's) started no earlier than about one
// renewal before this call, and its validity serves the claim: Renew then
// returns at once, and the claim's next Hold sees it.
func (m *Manager) Renew(ctx context.Context) error {
	return m.renewSince(ctx, m.renewed.Load())
}

// renewSince is Renew, by then before renewals had succeeded.
func (m *Manager) renewSince(ctx context.Context, before int64) error {
	if m.stopped.Load() {
		return errStopped
	}
	m.renewing.Lock()
	defer m.renewing.Unlock()
	if m.renewed.Load() != before {
		return nil
	}
	if m.cfg.Synced != nil && !m.cfg.Synced() {
		return ErrClockUnsynced
	}
	return m.renewHeld(ctx, m.now())
}

// renewHeld inserts the next term of every partition held, expiring a
// term after at. Call it with renewing held.
func (m *Manager) renewHeld(ctx context.Context, at instant) error {
	m.mu.RLock()
	terms := make([]Term, 0, len(m.owned))
	now := m.cfg.Local()
	for p, h := range m.owned {
		if !h.deadline.After(now) {
			continue // ran out: the round drops it, and takes it again if free
		}
		terms = append(terms, Term{Partition: p, Term: h.term + 1, Owner: m.cfg.WorkerID, ExpiresAt: at.server.Add(m.cfg.TermLength)})
	}
	m.mu.RUnlock()
	if len(terms) == 0 {
		return nil
	}
	won, err := m.insert(ctx, terms, at.local)
	if err != nil {
		return fmt.Errorf("renew %d partitions: %w", len(terms), err)
	}
	m.renewed.Add(1)
	if lost := len(terms) - won; lost > 0 {
		m.cfg.Logger.Warn("partitions lost at renewal: another worker took them after their term ran out", "lost", lost)
	}
	return nil
}

// renewalDue reports whether a third of a term has passed since a
// partition held was renewed: its deadline, a term less the Margin after
// the renewal's instant, is less than two thirds of a term less the
// Margin away (10 s after the last renewal by default). The interval
// counts from the renewal's start, not its end: counted from its end, a
// renewal that takes longer than a third of a term less a Margin (two
// round trips at +600 ms through a 5 s term) was due again the moment it
// returned, and renewals ran back to back. Renewing later would save
// inserts but shorten the validity a claim's writes get just before a
// renewal (Hold).
func (m *Manager) renewalDue() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	now := m.cfg.Local()
	for _, h := range m.owned {
		if h.deadline.Sub(now) < 2*m.cfg.TermLength/3-m.cfg.Margin {
			return true
		}
	}
	return false
}

// heartbeatDue reports whether the heartbeat is to be written now: at the
// first round, and then once a third of a term by the server's clock,
// alongside a renewal while this replica holds partitions. Its terms
// already count it live (Live), so its heartbeat need not bring a round of
// its own.
func (m *Manager) heartbeatDue(serverNow time.Time, renewing bool) bool {
	if m.beatAt.IsZero() {
		return true
	}
	if serverNow.Sub(m.beatAt) < m.cfg.TermLength/3 {
		return false
	}
	m.mu.RLock()
	holds := len(m.owned) > 0
	m.mu.RUnlock()
	return !holds || renewing
}

// rest reports whether the scheduled round may be left out: the last
// rounds changed nothing (quiet in a row leave out 2^quiet - 1 ticks, for
// at most quietMax), and neither a heartbeat nor a renewal is due. A
// replica that cannot publish never rests: its round gives its
// partitions back.
func (m *Manager) rest() bool {
	if m.quiet == 0 || (m.cfg.Ready != nil && m.cfg.Ready() != nil) {
		return false
	}
	apart := min(1<<m.quiet, int(quietMax/m.every))
	if m.rested+1 >= apart || m.renewalDue() || m.heartbeatDue(m.cfg.Now(), false) {
		return false
	}
	m.rested++
	return true
}

// take inserts the next term of free partitions, up to share, starting at
// a point of the ring that depends on the worker id so that replicas
// starting together mostly try different partitions.
func (m *Manager) take(ctx context.Context, latest map[int]Term, share int, at instant) (int, error) {
	serverNow := at.server
	m.mu.RLock()
	need := share - len(m.owned)
	var terms []Term
	if need > 0 {
		start := int(hash(m.cfg.WorkerID) % events.Partitions)
		for i := range events.Partitions {
			p := (start + i) % events.Partitions
			if _, mine := m.owned[p]; mine {
				continue
			}
			t, ok := latest[p]
			if !isFree(t, ok, serverNow, m.cfg.Margin) {
				continue
			}
			terms = append(terms, Term{Partition: p, Term: t.Term + 1, Owner: m.cfg.WorkerID, ExpiresAt: serverNow.Add(m.cfg.TermLength)})
			if len(terms) == need {
				break
			}
		}
	}
	m.mu.RUnlock()
	won, err := m.insert(ctx, terms, at.local)
	if err != nil {
		return 0, fmt.Errorf("take %d partitions: %w", len(terms), err)
	}
	if won > 0 {
		m.cfg.Logger.Info("partitions taken", "partitions", won, "share", share)
	}
	return won, nil
}

// insert inserts terms, if any, and records those won, with a deadline a
// term less the Margin after from: the local instant read with the server
// time their expiresAt counts from (instant), so no later than it. A lost
// term's partition is forgotten. It returns how many it won.
//
// One read after the insert checks what it did. A won term is kept only
// if no later term of its partition exists: old terms are pruned, so a
// replica that paused between its read and its insert for longer than a
// few terms could otherwise win an _id that was deleted under a newer
// owner (the later term is never pruned). A lost term whose _id is this
// replica's own counts as won: an earlier insert landed although it
// reported an error (a timeout), or its check read failed, and the
// renewal after it must not lose the partition to itself.
func (m *Manager) insert(ctx context.Context, terms []Term, from time.Time) (int, error) {
	if len(terms) == 0 {
		return 0, nil
	}
	won, err := m.table.Insert(ctx, terms)
	// ours are the lost terms whose _id an earlier insert of this replica
	// holds: an insert that landed although it reported an error, or whose
	// check read failed. Losing to itself must not cost a partition.
	var ours map[int]Term
	if err == nil {
		var after []Term
		if after, _, err = m.table.Read(ctx); err == nil {
			latest := Latest(after)
			for i, t := range terms {
				cur := latest[t.Partition]
				switch {
				case won[i] && cur.Term > t.Term:
					m.cfg.Logger.Warn("a term won after a pause is behind a newer owner's; not claiming in it",
						"partition", t.Partition, "term", t.Term, "owner", cur.Owner)
					won[i] = false
				case !won[i] && cur.Term == t.Term && cur.Owner == m.cfg.WorkerID && !cur.Released:
					if ours == nil {
						ours = map[int]Term{}
					}
					ours[t.Partition] = cur
				}
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n := 0
	for i, t := range terms {
		if cur, ok := ours[t.Partition]; ok {
			// Its deadline counts from the term's own expiry, not from
			// this insert: the earlier one was sent before.
			left := cur.ExpiresAt.Sub(m.cfg.Now())
			m.owned[t.Partition] = held{term: t.Term, since: m.sinceFor(t), deadline: m.cfg.Local().Add(left - m.cfg.Margin)}
			n++
			continue
		}
		if won[i] {
			m.owned[t.Partition] = held{term: t.Term, since: m.sinceFor(t), deadline: from.Add(m.cfg.TermLength - m.cfg.Margin)}
			n++
		} else if h, ok := m.owned[t.Partition]; ok {
			m.sawHeld(m.claimsUntil(h, m.cfg.Local()))
			delete(m.owned, t.Partition)
		}
	}
	return n, nil
}

// sinceFor is the tenure of t once won: the tenure held on, for a
// renewal, or t's own term. Call with mu held.
func (m *Manager) sinceFor(t Term) int64 {
	if h, ok := m.owned[t.Partition]; ok && h.term == t.Term-1 {
		return h.since // a renewal: ownership goes on unbroken
	}
	return t.Term
}

// Release gives back every partition this replica holds and removes its
// heartbeat, so that the others take its share at once rather than after
// its terms run out: for a clean stop, after the last claim and with the
// ticks stopped.
func (m *Manager) Release(ctx context.Context) error {
	if ps := m.Owned(); len(ps) > 0 {
		if err := m.release(ctx, ps, m.cfg.Now()); err != nil {
			return err
		}
	}
	if m.beatAt.IsZero() {
		return nil // no heartbeat written: nothing to remove
	}
	if err := m.table.Prune(ctx, nil, []string{m.cfg.WorkerID}); err != nil {
		return fmt.Errorf("remove heartbeat: %w", err)
	}
	m.beatAt, m.led, m.quiet = time.Time{}, false, 0
	m.cfg.Metrics.PartitionsOwned.Set(0)
	return nil
}
