package ownership

// Rounds: read the owners, heartbeat, drop what was lost, give back the
// excess, take up to the share, prune; and the rest between rounds once the
// shares hold still.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxrelay/outbox/events"
)

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

// restMax is how far apart settled rounds may rest: quietMax, or a third
// of a term where that is longer, the renewals' own period. With a longer
// stale threshold (OUTBOX_STALE_AFTER, terms of half of it) an idle
// outbox's rounds then come with its renewals rather than every 8 s: at
// ten minutes, one read of the owners every 100 s instead of 12, the
// largest part of what a fleet of idle outboxes costs. A replica that
// joins waits that much longer for its share, at most a third of a term.
func (m *Manager) restMax() time.Duration {
	return max(quietMax, m.cfg.TermLength/3)
}

// quietShiftMax caps the doubling, whatever the tick.
const quietShiftMax = 8

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
	fenced := m.dropFenced(serverNow)
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
	if len(fenced) > 0 {
		if err := m.giveBackFenced(ctx, fenced, latest); err != nil {
			return err
		}
	}
	took, err := m.take(ctx, latest, share, at)
	if err != nil {
		return err
	}
	if len(excess)+len(fenced) == 0 && took == 0 && live == m.live && !anyFree(latest, serverNow, m.cfg.Margin) {
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

// rest reports whether the scheduled round may be left out: the last
// rounds changed nothing (quiet in a row leave out 2^quiet - 1 ticks, for
// at most restMax), and neither a heartbeat nor a renewal is due. A
// replica that cannot publish never rests: its round gives its
// partitions back.
func (m *Manager) rest() bool {
	if m.quiet == 0 || (m.cfg.Ready != nil && m.cfg.Ready() != nil) {
		return false
	}
	apart := min(1<<m.quiet, int(m.restMax()/m.every))
	if m.rested+1 >= apart || m.renewalDue() || m.heartbeatDue(m.cfg.Now(), false) {
		return false
	}
	m.rested++
	return true
}

// take inserts the next term of free partitions, up to share, starting at
// a point of the ring that depends on the worker id so that replicas
// starting together mostly try different partitions. The next term of a
// partition whose fence refused this replica is numbered above the fence
// (see Wrote). For a term after a jump of the server clock it takes
// nothing (see ClockJumped).
func (m *Manager) take(ctx context.Context, latest map[int]Term, share int, at instant) (int, error) {
	serverNow := at.server
	if m.jumped(m.cfg.Local()) {
		return 0, nil
	}
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
			terms = append(terms, Term{Partition: p, Term: max(t.Term, m.fenceOf(p)) + 1, Owner: m.cfg.WorkerID, ExpiresAt: serverNow.Add(m.cfg.TermLength)})
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
