package claim

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"time"
)

// batchLimit sizes claims by what the database has shown it can take:
// additive increase, multiplicative decrease, as TCP sizes its window. A
// claim or an outcome write that times out halves the next claim, down
// to one event; each claim that succeeds at the limit, or finds all there
// was, grows it back by a step. A database slow because it is overloaded serves smaller batches
// faster; one slow because each round trip is long is served best by the
// full batch, which the limit grows back to while nothing times out.
type batchLimit struct {
	max  int // Config.BatchSize
	step int // the additive increase: the limit regrows in about 16 claims

	mu  sync.Mutex
	cur int
}

// batchRegrowClaims is about how many successful full claims take the
// limit from one event back to Config.BatchSize.
const batchRegrowClaims = 16

func newBatchLimit(size int) *batchLimit {
	return &batchLimit{max: size, step: max(1, size/batchRegrowClaims), cur: size}
}

// get returns the number of events the next claim may take.
func (b *batchLimit) get() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cur
}

// timedOut halves the limit, down to one, and returns it.
func (b *batchLimit) timedOut() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cur = max(1, b.cur/2)
	return b.cur
}

// succeeded grows the limit by a step after a claim that took as many
// events as it allowed, or that found all there was to take (quiet): in a
// quiet outbox the limit drifts back to the batch size over the ticks,
// instead of staying below it, and Slow with it, until a backlog came. A
// claim that took fewer and stopped at another bound (its bytes) says
// nothing about a larger one.
func (b *batchLimit) succeeded(took int, quiet bool) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if took >= b.cur || quiet {
		b.cur = min(b.max, b.cur+b.step)
	}
	return b.cur
}

// writeTimes estimates how long a claim's write of n events takes, from
// the writes observed lately: so that a claim does not start a write it
// cannot finish inside its partitions' validity.
//
// A write costs a round trip and then some work per event. The estimate
// keeps the two apart, or a database far away would look slow per event:
// it fits a line through the recent writes, time against events (least
// squares), whose intercept is the base (the round trip and then some)
// and whose slope is the cost per event. Only writes of different sizes
// tell a cost per event: writes of about one size give a slope of about
// nothing, and their times, noise included, go to the base. Scaling whole
// writes by their size instead made writes of a few events through a slow
// link look like hours for a full batch; taking the fastest write as the
// base and the worst excess per event as the cost did the same with a few
// small writes slowed by the database's own variance. Either way every
// claim was trimmed to a few events, and the next small write kept the
// estimate where it was: a loop of its own making.
type writeTimes struct {
	mu   sync.Mutex
	seen [writeTimesKept]writeTime
	next int
}

// writeTimesKept is how many recent writes the estimate rests on: enough
// to span a few seconds of a draining backlog, few enough that a database
// that got faster is believed within a few claims.
const writeTimesKept = 8

// writeHeadroom is how many times an estimated write the validity must
// cover before the write starts, until the writes seen show how much they
// vary: a database's slowness varies from one write to the next by more
// than the estimate can know.
const writeHeadroom = 2

// Once writeSpreadWrites writes are seen, the headroom is sized from how
// far they strayed from the estimate: writeSpreadMargin times the worst
// of them (its time over the estimate's for its size), between
// writeSpreadMargin and writeHeadroom. Writes that keep to the estimate,
// as through a distant but steady link, need a quarter more, not twice:
// twice made every claim of a 5 s term at +600 ms a round trip renew again
// before its write, a renewal (two round trips) in the path of each batch.
const (
	writeSpreadWrites = 2
	writeSpreadMargin = 1.25
)

type writeTime struct {
	events int
	took   time.Duration
}

// observe records that a write of n events took d. A write that timed out
// is recorded too, with the time it was given: it needs at least that.
func (w *writeTimes) observe(n int, d time.Duration) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen[w.next] = writeTime{events: n, took: d}
	w.next = (w.next + 1) % writeTimesKept
}

// any reports whether a write has been observed.
func (w *writeTimes) any() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.seen {
		if s.events > 0 {
			return true
		}
	}
	return false
}

// model returns the base and the cost per event (see writeTimes); ok is
// false before any write and without a prior.
//
// Before any write, prior stands for the base: the time of a claim's
// read (see Claimer.writeNeed), which costs at least the round trip a
// write needs. Without it the first write had no estimate, the fence gave
// it whatever validity was left, and through a slow link it timed out
// every time.
func (w *writeTimes) model(prior time.Duration) (base time.Duration, perEvent float64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var k, sumN, sumT float64
	for _, s := range w.seen {
		if s.events > 0 {
			k++
			sumN += float64(s.events)
			sumT += float64(s.took)
		}
	}
	if k == 0 {
		return prior, 0, prior > 0
	}
	meanN, meanT := sumN/k, sumT/k
	var cov, varN float64
	for _, s := range w.seen {
		if s.events > 0 {
			dn := float64(s.events) - meanN
			cov += dn * (float64(s.took) - meanT)
			varN += dn * dn
		}
	}
	if varN > 0 && cov > 0 {
		perEvent = cov / varN
	}
	return time.Duration(max(math.Round(meanT-perEvent*meanN), 0)), perEvent, true
}

// need is the validity a write of n events should have left when it
// starts: the headroom times the estimate (see model for prior). Zero
// with neither a write nor a prior.
func (w *writeTimes) need(n int, prior time.Duration) time.Duration {
	base, perEvent, ok := w.model(prior)
	if !ok {
		return 0
	}
	return time.Duration(w.headroom(base, perEvent) * float64(base+time.Duration(math.Round(perEvent*float64(n)))))
}

// headroom is how many times the estimate (base, perEvent) a write needs:
// writeHeadroom, or once writeSpreadWrites writes are seen, sized from how
// far the worst of them strayed from it (see writeSpreadMargin).
func (w *writeTimes) headroom(base time.Duration, perEvent float64) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen, worst := 0, 0.0
	for _, s := range w.seen {
		if s.events <= 0 {
			continue
		}
		seen++
		if est := float64(base) + perEvent*float64(s.events); est > 0 {
			worst = max(worst, float64(s.took)/est)
		}
	}
	if seen < writeSpreadWrites {
		return writeHeadroom
	}
	return min(max(writeSpreadMargin*worst, writeSpreadMargin), writeHeadroom)
}

// fit returns the most events, up to n, to write in validFor: those whose
// need fits. Where the base alone takes the headroom, fewer events would
// not fit either, so it returns as many as the estimate itself fits (no
// headroom), and none only where not even the base fits: a write of one
// event costs about the base too, and a claim trimmed to one event for
// its base's sake wasted its round trips.
//
// Before any write it returns n: the read that stands in for a write in
// need (the prior) costs more round trips than a write, and serves to
// make the fence renew first, not to refuse or trim the write.
func (w *writeTimes) fit(n int, validFor time.Duration) int {
	base, perEvent, ok := w.model(0)
	switch {
	case !ok:
		return n
	case base >= validFor:
		return 0
	case perEvent == 0:
		return n
	}
	k := (float64(validFor)/w.headroom(base, perEvent) - float64(base)) / perEvent
	if k < 1 {
		k = float64(validFor-base) / perEvent
	}
	return int(min(float64(n), k))
}

// recentTimes keeps the durations of a claim's recent reads, or of its
// renewals, for timing a renewal beside the read (see Claimer.claim) and
// for estimating a first write (see writeTimes.model).
type recentTimes struct {
	mu   sync.Mutex
	seen [writeTimesKept]time.Duration
	next int
}

func (r *recentTimes) observe(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[r.next] = d
	r.next = (r.next + 1) % writeTimesKept
}

// longest returns the longest recent duration, 0 before any.
func (r *recentTimes) longest() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var m time.Duration
	for _, d := range r.seen {
		m = max(m, d)
	}
	return m
}

// shortest returns the shortest recent duration, 0 before any.
func (r *recentTimes) shortest() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var m time.Duration
	for _, d := range r.seen {
		if d > 0 && (m == 0 || d < m) {
			m = d
		}
	}
	return m
}

// isTimeout reports a store error that says the database did not answer
// in time: a context deadline, a network timeout, or a server-side time
// limit that a store reports as context.DeadlineExceeded.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
