// Package check hunts interleavings of the ordered claim: a seeded,
// deterministic simulation of several replicas running the REAL
// plan.Planner inside a model of the store's protocol around it (lane
// read, holds, parking, the parked-keys cache, unpark steps, the
// read-ahead, the guarded claim write, publishing in rounds, settling,
// recovery, ownership terms) against an in-memory outbox whose commands a
// seeded scheduler delays, answers late or loses. It is a model of the
// store, not the store: mongo.Store is not run here (docs/ordering.md,
// "The interleaving checker", says what the model leaves out).
//
// Everything runs on one goroutine from one math/rand/v2 PCG stream, and
// every iteration that can change what happens goes over sorted keys, so
// a seed replays exactly (TestInterleavingsReplay checks it).
package check

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
)

// ms is simulated time in milliseconds: the database's clock, which is
// also the monotonic clock leases are measured with.
type ms = int64

// Knobs re-open one known hole of the protocol each,
// in the model only; only tests set them.
type Knobs struct {
	// DropByteCut: a claim cut by the byte bound drops the event that did
	// not fit instead of starting its read-ahead with it (hole 1).
	DropByteCut bool
	// EarlyRelease: a resume or requeue takes a key out of the parked-keys
	// cache when its unpark is queued, not once it is written (hole 2).
	EarlyRelease bool
	// LatePark: parks are written after the claim's write, without the
	// term's guard, and a give-back does not wait for them (hole 4).
	LatePark bool
	// StragglingPark: a key leaves the parked cache (released) while a
	// park write of its events may still land, as the store lets it: the
	// hole this checker found (docs/ordering.md, The interleaving
	// checker).
	StragglingPark bool
	// PartialClaim: a claim that won an event but lost an earlier one of
	// its key to another write publishes it (hole 3, first part).
	PartialClaim bool
	// StaleSteps: an unpark step queued before its partition was lost
	// and taken again is written under the new term, and a written step
	// counts against whatever cache entry its keys name now, as the store
	// does (mongo/lane.go stepDone): a suspicion this checker raised.
	StaleSteps bool
	// UnparkInDoubt: an unpark step whose reply did not come keeps the
	// read-ahead, as the store does (it drops it when a step moved
	// events): the step may land after the lane was read, and its retry
	// moves nothing. A hole this checker found.
	UnparkInDoubt bool
}

// Counters are how often a run reached the states the known holes need.
type Counters struct {
	// ByteCutAhead: a claim cut by the byte bound whose cut event has a
	// later event of its key in the read-ahead.
	ByteCutAhead int
	// ResumeDuringUnpark: an event written while the owner of its
	// partition has an unpark step queued that would unpark an earlier
	// event of its key (resumed type or released key).
	ResumeDuringUnpark int
	// LateClaimReply: a claim write that won events answered after the
	// replica's deadline, when it was already in doubt.
	LateClaimReply int
	// ParkAcrossGiveBack: a give-back decided while a park write in the
	// partition could still land.
	ParkAcrossGiveBack int
	// WonBehindLost: a claim write won an event but lost an earlier one
	// of its key (hole 3's first part); not one of the four required.
	WonBehindLost int
}

func (c *Counters) add(o Counters) {
	c.ByteCutAhead += o.ByteCutAhead
	c.ResumeDuringUnpark += o.ResumeDuringUnpark
	c.LateClaimReply += o.LateClaimReply
	c.ParkAcrossGiveBack += o.ParkAcrossGiveBack
	c.WonBehindLost += o.WonBehindLost
}

// Result is one seed's run.
type Result struct {
	Seed      uint64
	Violation string // empty: the oracle found nothing
	Counters
	Ops       int64 // database commands and broker publishes executed
	Events    int   // events written
	Delivered int   // first deliveries
	Ferret    bool  // FerretDB's write semantics
	// Fingerprint hashes the order of first deliveries, the final states
	// and Ops: the same seed gives the same fingerprint.
	Fingerprint uint64
}

// event is one thing the scheduler runs at a time; who is the replica it
// runs on (nil: the database, the broker, the world), whose stall defers
// it.
type event struct {
	at  ms
	seq uint64
	who *replica
	fn  func()
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// sim is one run: the scheduler and everything it runs.
type sim struct {
	seed  uint64
	rng   *rand.Rand
	cfg   config
	knobs Knobs
	now   ms
	seq   uint64
	q     queue
	db    *db
	reps  []*replica
	own   []owner // the ownership table, by partition
	term  int64   // the last term handed out
	or    *oracle
	c     Counters
	ops   int64
	// drain: the quiescent phase (no faults, everything resumed and
	// FAILED events skipped); over: every event reached its end.
	drain, over bool
	violation   string
	// traceAgg, where set (OUTBOX_TEST_CHECK_TRACE with OUTBOX_TEST_CHECK_SEED),
	// names the aggregate whose story tracef tells.
	traceAgg string
	traced   []string
}

// tracef notes a step of the traced aggregate's story.
func (s *sim) tracef(agg string, format string, args ...any) {
	if s.traceAgg != "" && agg == s.traceAgg {
		s.traced = append(s.traced, fmt.Sprintf("%6d ", s.now)+fmt.Sprintf(format, args...))
	}
}

// owner is one partition's row of the ownership table.
type owner struct {
	replica int // -1: nobody
	term    int64
	expiry  ms
}

func (s *sim) at(t ms, who *replica, fn func()) {
	s.seq++
	heap.Push(&s.q, &event{at: t, seq: s.seq, who: who, fn: fn})
}

func (s *sim) after(d ms, who *replica, fn func()) { s.at(s.now+d, who, fn) }

// loop runs events until time until, the run is over, or the oracle
// found a violation. A stalled replica's events wait for its stall to
// end, in their order.
func (s *sim) loop(until ms) {
	for s.q.Len() > 0 && !s.over && s.violation == "" {
		e := s.q[0]
		if e.at > until {
			return
		}
		heap.Pop(&s.q)
		if e.who != nil && e.who.stalledUntil > max(s.now, e.at) {
			e.at = e.who.stalledUntil
			heap.Push(&s.q, e)
			continue
		}
		s.now = max(s.now, e.at)
		e.fn()
	}
}

// fail records the first violation; the run stops there.
func (s *sim) fail(msg string) {
	if s.violation == "" {
		s.violation = msg
	}
}

// chance reports true with probability p.
func (s *sim) chance(p float64) bool { return s.rng.Float64() < p }

// between draws a time in [lo, hi].
func (s *sim) between(lo, hi ms) ms { return lo + s.rng.Int64N(hi-lo+1) }

// net is one message's way over the network: a delay, or lost. Outside
// the drain phase a message is slow (up to netMax) or lost now and then.
func (s *sim) net() (d ms, lost bool) {
	if !s.drain {
		if s.chance(s.cfg.pLost) {
			return 0, true
		}
		if s.chance(s.cfg.pSlow) {
			return s.between(0, s.cfg.netMax), false
		}
	}
	return 1 + s.rng.Int64N(3), false
}

// execDelay is how long the database takes to run a write once it has
// it: now and then up to the command's whole time budget.
func (s *sim) execDelay() ms {
	if !s.drain && s.chance(s.cfg.pSlow) {
		return s.between(0, s.cfg.budget)
	}
	return s.rng.Int64N(3)
}

// errTimeout is the reply of a command the database ran out of time for.
type errTimeout struct{}

// call sends a command from r: it reaches the database after a network
// delay (or never), runs there (exec, which replies once, possibly
// later), and its reply comes back after another delay (or never). done
// gets the reply, or ok false at the client's deadline (budget after the
// send), whichever comes first. A reply after that is late (late, if
// set). The database runs the command for budget from its arrival (the
// driver's maxTimeMS), so a write can land until budget+netMax after the
// send: the window a give-back waits out.
func (s *sim) call(r *replica, budget ms, exec func(end ms, reply func(any)), done func(res any, ok bool), late func(res any)) {
	sent := s.now
	finished := false
	if d, lost := s.net(); !lost {
		s.at(sent+d, nil, func() {
			s.ops++
			exec(s.now+budget, func(res any) {
				d2, lost := s.net()
				if lost {
					return
				}
				s.at(s.now+d2, r, func() {
					if finished {
						if late != nil {
							late(res)
						}
						return
					}
					finished = true
					_, timedOut := res.(errTimeout)
					done(res, !timedOut)
				})
			})
		})
	}
	s.at(sent+budget, r, func() {
		if !finished {
			finished = true
			done(nil, false)
		}
	})
}

// Run runs one seed with knobs, and checks it with the oracle.
func Run(seed uint64, knobs Knobs) Result { return run(seed, knobs, "").Result }

type traced struct {
	Result
	trace []string
}

// run runs seed, telling the story of aggregate traceAgg (none: "").
func run(seed uint64, knobs Knobs, traceAgg string) traced {
	s := &sim{seed: seed, rng: rand.New(rand.NewPCG(seed, 0x40)), knobs: knobs, traceAgg: traceAgg}
	s.cfg = drawConfig(s.rng)
	s.db = newDB(s)
	s.or = newOracle(s)
	s.own = make([]owner, partitions)
	for p := range s.own {
		s.own[p].replica = -1
	}
	for i := range s.cfg.replicas {
		s.reps = append(s.reps, newReplica(s, i))
	}
	s.startWorld()
	s.loop(s.cfg.faultFor)
	if s.violation == "" && !s.over {
		s.startDrain()
		s.loop(s.cfg.faultFor + drainFor)
	}
	if s.violation == "" {
		s.or.final()
	}
	return traced{Result: Result{
		Seed: seed, Violation: s.violation, Counters: s.c, Ops: s.ops,
		Events: len(s.db.docs), Delivered: s.or.delivered, Ferret: s.cfg.ferret,
		Fingerprint: s.or.fingerprint(),
	}, trace: s.traced}
}
