package check

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/outboxrelay/outbox/events"
)

const (
	partitions = events.Partitions
	// lease is how long a term lasts without a renewal; renewEvery is how
	// often a replica renews; staleAfter is recovery's threshold.
	lease      ms = 4000
	renewEvery ms = 1000
	staleAfter ms = 10000
	// drainFor bounds the quiescent phase: every event must reach its end
	// within it.
	drainFor ms = 120_000
	// parkedReload is how often a replica reads its parked keys again
	// (mongo/lane.go); aheadMaxAge how long a read-ahead serves.
	parkedReload ms = 60_000
	aheadMaxAge  ms = 30_000
	// minBudget is the least time a lane write is sent with.
	minBudget ms = 20
)

var types = []string{"created", "updated", "shipped"}

// config is what a seed draws besides the interleaving: which faults are
// on and how often (swarm testing), the limits, the sizes.
type config struct {
	ferret      bool // FerretDB's write semantics, else MongoDB's
	failedHolds bool // a FAILED event holds its aggregate
	replicas    int
	events      int // events written in the run
	aggregates  int
	padMax      int
	faultFor    ms // the faulty phase, producers writing throughout
	// the claim's limits: Events, Bytes (0: none), read-ahead batches
	batch, bytes, aheadBatches int
	unparkSteps                int // unpark steps a claim writes at most
	netMax, budget             ms  // network delay bound, command budget
	pLost, pSlow               float64
	pNack, pReturn             float64
	maxAttempts                int
	faultEvery                 ms // mean time between stalls, jumps, give-backs
	operatorEvery              ms
}

func drawConfig(r *rand.Rand) config {
	c := config{
		ferret:        r.IntN(2) == 0,
		failedHolds:   r.IntN(5) > 0,
		replicas:      3 + r.IntN(2),
		events:        300 + r.IntN(150),
		aggregates:    10 + r.IntN(30),
		padMax:        100 + r.IntN(600),
		faultFor:      15_000 + r.Int64N(15_000),
		batch:         3 + r.IntN(14),
		unparkSteps:   1 + r.IntN(4),
		netMax:        200 + r.Int64N(800),
		pLost:         0.002 + r.Float64()*0.02,
		pSlow:         0.01 + r.Float64()*0.06,
		pNack:         r.Float64() * 0.1,
		pReturn:       r.Float64() * 0.05,
		maxAttempts:   2 + r.IntN(3),
		faultEvery:    300 + r.Int64N(1500),
		operatorEvery: 300 + r.Int64N(1500),
	}
	c.budget = c.netMax + r.Int64N(1000)
	if r.IntN(4) > 0 {
		c.bytes = 400 + r.IntN(2500)
	}
	if r.IntN(5) > 0 {
		c.aheadBatches = 1 + r.IntN(8)
	}
	return c
}

// startWorld schedules the producers, the operators, the faults, the
// balancer, recovery, and each replica's loops.
func (s *sim) startWorld() {
	s.produce()
	s.at(0, nil, s.balance)
	s.at(s.between(0, staleAfter), nil, s.recover)
	s.at(s.cfg.operatorEvery, nil, s.operate)
	s.at(s.cfg.faultEvery, nil, s.fault)
	s.at(250, nil, s.checkOver)
	for _, r := range s.reps {
		s.at(s.between(1, 50), r, r.cycle)
		s.at(s.between(1, renewEvery), r, r.renew)
	}
}

// produce schedules the run's writes over the faulty phase: each to an
// aggregate (a few hot ones more often) or to none, of a random type, in
// bursts now and then, as producers keep writing through pauses, unparks
// and give-backs.
func (s *sim) produce() {
	at := ms(0)
	step := s.cfg.faultFor * 8 / 10 / ms(s.cfg.events)
	for n := 0; n < s.cfg.events; {
		burst := 1
		if s.chance(0.15) {
			burst = 2 + s.rng.IntN(8)
		}
		agg := s.rng.IntN(s.cfg.aggregates)
		if s.chance(0.3) {
			agg = s.rng.IntN(3) // hot aggregates
		}
		for range min(burst, s.cfg.events-n) {
			keyed := !s.chance(0.1)
			typ := types[s.rng.IntN(len(types))]
			pad := s.rng.IntN(s.cfg.padMax + 1)
			a := agg
			s.at(at, nil, func() { s.db.insert(a, keyed, typ, pad) })
			n++
		}
		at += s.rng.Int64N(2*step + 1)
	}
}

// balance hands the partitions nobody holds (given back, or whose term
// expired) to a replica that is not stalled, under a new term.
func (s *sim) balance() {
	for p := range s.own {
		o := &s.own[p]
		if o.replica >= 0 && s.now <= o.expiry {
			continue
		}
		var up []*replica
		for _, r := range s.reps {
			if r.stalledUntil <= s.now {
				up = append(up, r)
			}
		}
		if len(up) == 0 {
			break
		}
		r := up[s.rng.IntN(len(up))]
		s.term++
		*o = owner{replica: r.id, term: s.term, expiry: s.now + lease}
		r.acquire(p, s.term, s.now+lease)
		s.tracePartition(p, "partition %d to replica %d under term %d", p, r.id, s.term)
	}
	s.after(100, nil, s.balance)
}

// recover puts back to NEW the events PROCESSING for longer than
// staleAfter (by the processingAt their claim wrote, on its clock).
func (s *sim) recover() {
	s.db.update(&update{name: "recover",
		match: func(d *doc) bool {
			return d.status == statusProcessing && d.processingAt < s.now-staleAfter
		},
		set: func(d *doc) { d.status, d.worker, d.token = statusNew, -1, 0 },
	}, s.now+1000, func(any) {})
	s.after(2000, nil, s.recover)
}

// operate is an operator: pauses and resumes types, requeues and skips
// FAILED events. In the drain phase it resumes everything and skips
// every FAILED event, so that every aggregate can drain.
func (s *sim) operate() {
	if s.drain {
		for _, t := range slices.Clone(s.db.pausedTypes()) {
			s.db.resume(t)
		}
		s.db.update(&update{name: "skip all",
			match: func(d *doc) bool { return d.status == statusFailed && !d.skipped },
			set:   func(d *doc) { d.skipped, d.m.skipped = true, true },
		}, s.now+1000, func(any) {})
		s.after(500, nil, s.operate)
		return
	}
	switch t := types[s.rng.IntN(len(types))]; s.rng.IntN(4) {
	case 0:
		if len(s.db.pausedTypes()) < 2 {
			s.db.pause(t)
		}
	case 1:
		if ps := s.db.pausedTypes(); len(ps) > 0 {
			s.db.resume(ps[s.rng.IntN(len(ps))])
		}
	case 2, 3:
		var failed []*doc
		for _, d := range s.db.docs {
			if d.status == statusFailed {
				failed = append(failed, d)
			}
		}
		if len(failed) == 0 {
			break
		}
		d := failed[s.rng.IntN(len(failed))]
		if s.chance(0.5) {
			s.db.requeue(d)
		} else {
			s.db.skip(d)
		}
	}
	s.after(s.between(s.cfg.operatorEvery/2, 2*s.cfg.operatorEvery), nil, s.operate)
}

// fault stalls a replica (a GC pause, a VM freeze), jumps its clock, or
// has it give back partitions.
func (s *sim) fault() {
	if s.drain {
		return
	}
	r := s.reps[s.rng.IntN(len(s.reps))]
	switch s.rng.IntN(5) {
	case 0:
		r.stalledUntil = max(r.stalledUntil, s.now+s.between(100, 7000))
	case 1:
		r.offset = max(-6000, min(6000, r.offset+s.between(-5000, 5000)))
	default:
		owned := r.ownedList()
		for range 1 + s.rng.IntN(4) {
			if len(owned) > 0 {
				r.giveBack(owned[s.rng.IntN(len(owned))])
			}
		}
	}
	s.after(s.between(s.cfg.faultEvery/2, 2*s.cfg.faultEvery), nil, s.fault)
}

// startDrain ends the faults: from now on the network is clean, nothing
// is paused for long, and the run ends once every event has.
func (s *sim) startDrain() {
	s.drain = true
	s.at(s.now, nil, s.operate)
}

// checkOver ends the run once every event is PUBLISHED or FAILED and
// the producers are done.
func (s *sim) checkOver() {
	if s.drain && len(s.db.docs) == s.cfg.events && s.db.allDone() {
		s.over = true
		return
	}
	s.after(250, nil, s.checkOver)
}

// describe names an event for a report.
func describe(d *doc) string {
	return fmt.Sprintf("%s (aggregate %q, type %s, partition %d, status %s, parked %v)",
		d.id, d.aggID, d.typ, d.partition, d.status, d.parked)
}

// tracePartition tells of ownership changes of the traced aggregate's
// partition.
func (s *sim) tracePartition(p int, format string, args ...any) {
	if s.traceAgg == "" {
		return
	}
	for _, k := range []string{"order", "cart"} {
		if events.PartitionOf(events.Key(k, s.traceAgg)) == p {
			s.tracef(s.traceAgg, format, args...)
			return
		}
	}
}
