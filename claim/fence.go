package claim

// The fence: a claim writes only within the validity of the partitions it
// read in, renewing them beside its read or before its write, and keeps
// only the events of partitions held without a break (docs/design.md, The
// time fence).

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// writeNeed is the validity a write of n events should have left when it
// starts (writeTimes.need), the claim's shortest recent read standing for
// a write before any was seen.
func (c *Claimer) writeNeed(n int) time.Duration { return c.writes.need(n, c.reads.shortest()) }

// Round trips of a claim's read (the ordered read takes three in a row,
// see the mongo package) and of a renewal (an insert and its check read),
// for estimating them from the database's round trip before any was timed.
const (
	readRoundTrips        = 1
	orderedReadRoundTrips = 3
	renewRoundTrips       = 2
)

// readTimes returns the shortest and the longest of the claim's recent
// reads. Before any read, both are the round trips of a read at
// Config.RoundTrip: so that the first claim after a start, whose read and
// renewal nothing has timed yet, renews beside its read like later ones
// instead of in its write's path.
func (c *Claimer) readTimes() (shortest, longest time.Duration) {
	if shortest = c.reads.shortest(); shortest > 0 {
		return shortest, c.reads.longest()
	}
	trips := readRoundTrips
	if c.ordered() {
		trips = orderedReadRoundTrips
	}
	d := c.roundTrips(trips)
	return d, d
}

// renewTime returns the longest of the claim's recent renewals, or before
// any the round trips of a renewal at Config.RoundTrip.
func (c *Claimer) renewTime() time.Duration {
	if d := c.renews.longest(); d > 0 {
		return d
	}
	return c.roundTrips(renewRoundTrips)
}

// roundTrips returns n round trips at Config.RoundTrip, 0 without it.
func (c *Claimer) roundTrips(n int) time.Duration {
	if c.cfg.RoundTrip == nil {
		return 0
	}
	return time.Duration(n) * c.cfg.RoundTrip()
}

// renew renews the partitions and times the renewal.
func (c *Claimer) renew(ctx context.Context) error {
	start := time.Now()
	err := c.cfg.Owner.Renew(ctx)
	if err == nil {
		c.renews.observe(time.Since(start))
	}
	return err
}

// renewal is a renewal beside a claim's read (Claimer.renewBeside).
type renewal struct {
	stop chan struct{}
	done chan error
}

// errRenewalLeftOut is a renewal's result when the read ended before it
// started: the fence renews if the write needs it.
var errRenewalLeftOut = errors.New("renewal left out: the read ended first")

// renewBeside renews the partitions in the background after delay (the
// expected read less the expected renewal, from the times measured
// lately), so that the renewed validity counts from about the end of the
// read rather than its start. A read that ends before the renewal starts
// leaves it out.
func (c *Claimer) renewBeside(ctx context.Context, delay time.Duration) *renewal {
	r := &renewal{stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		if delay > 0 {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-r.stop:
				r.done <- errRenewalLeftOut
				return
			}
		}
		r.done <- c.renew(ctx)
	}()
	return r
}

// wait returns the renewal's result once it is over, leaving it out if it
// has not started.
func (r *renewal) wait() error {
	close(r.stop)
	return <-r.done
}

// fence holds the partitions for a claim's write of docs (in claim
// order, as read), read in the partitions before held: it keeps the
// documents of the partitions still held under the same tenure, and
// returns those partitions (nil: every one, without an owner), how long
// the write may take and the function that ends the hold. When the
// validity left is short of what the write needs, it renews the
// partitions first, and then keeps no more documents than fit; after a
// successful renewal at least one, so that a database slower than the
// estimate allows still gets a write, and with it a new estimate.
//
// renewedBeside says a renewal beside the read succeeded. Before any
// write it stands for the fence's own: the need of a first write (twice
// the read, see writeTimes.model) is there to make the partitions be
// renewed first, and the validity is enough once it covers the read
// itself, which costs more round trips than the write.
func (c *Claimer) fence(ctx context.Context, before []int64, docs []bson.Raw, renewedBeside bool) ([]bson.Raw, []bool, time.Duration, func()) {
	if c.cfg.Owner == nil {
		return docs, nil, c.cfg.StaleAfter, func() {}
	}
	renewed, tried := false, false
	firstWrite := !c.writes.any()
	for {
		now, validFor, done := c.cfg.Owner.Hold()
		owned := sameTerms(before, now)
		kept := keepOwned(docs, owned)
		if renewedBeside && firstWrite && !tried && validFor >= c.reads.shortest() {
			renewed, tried = true, true
		}
		if tried || len(kept) == 0 || c.writeNeed(len(kept)) <= validFor {
			n := c.writes.fit(len(kept), validFor)
			if renewed && len(kept) > 0 {
				n = max(n, 1)
			}
			if n < len(kept) {
				c.metrics.ClaimTrimmed.Add(float64(len(kept) - n))
			}
			return kept[:n], owned, validFor, done
		}
		done()
		tried = true
		c.logger.Debug("renewing the partitions before a claim's write", "valid_for", validFor, "write_needs", c.writeNeed(len(kept)))
		if err := c.renew(ctx); err != nil {
			c.logger.Warn("could not renew the partitions before a claim's write; claiming what fits", "error", err)
		} else {
			renewed = true
		}
	}
}

// orderingKeys returns the ordering keys of docs.
func orderingKeys(docs []bson.Raw) []string {
	var keys []string
	for _, d := range docs {
		if k, ok := events.OrderingKey(d); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// docPartitions returns the partitions of docs, each once.
func docPartitions(docs []bson.Raw) []int {
	var seen [events.Partitions]bool
	var ps []int
	for _, d := range docs {
		if p := events.Partition(d); p < events.Partitions && !seen[p] {
			seen[p] = true
			ps = append(ps, p)
		}
	}
	return ps
}

// keepOwned keeps the documents of the partitions owned marks, in their
// order. A partition is all or nothing, and with it every ordering key in
// it, so what is kept of a key is still a prefix of its events.
func keepOwned(docs []bson.Raw, owned []bool) []bson.Raw {
	kept := make([]bson.Raw, 0, len(docs))
	for _, doc := range docs {
		if p := events.Partition(doc); p < len(owned) && owned[p] {
			kept = append(kept, doc)
		}
	}
	return kept
}

// sameTerms marks the partitions owned (a term not 0) under the same term
// in before and now.
func sameTerms(before, now []int64) []bool {
	owned := make([]bool, len(now))
	for p := range now {
		owned[p] = now[p] != 0 && p < len(before) && before[p] == now[p]
	}
	return owned
}

// Parker is a Store that parks what its read found must wait only when
// told, so that the claimer writes the parks while it holds their
// partitions: a park that landed after a give-back would be unseen by
// the new owner, which could take a later event of the aggregate first.
type Parker interface {
	// WriteParked parks what the last ReadClaimable found must wait, in
	// limit.Owned's partitions, and returns the partitions it wrote in.
	WriteParked(ctx context.Context, limit events.ClaimLimit) ([]int, error)
	// Forget drops what the last read found to park, unwritten.
	Forget()
}

// writeParked has a Parker store park what the claim's read found, in the
// partitions still held under the tenure read with (owned; nil: every
// one), before until, when the hold's validity ends. A park in doubt keeps
// its partitions as a claim's write in doubt does.
func (c *Claimer) writeParked(ctx context.Context, limit events.ClaimLimit, owned []bool, until time.Time) {
	p, ok := c.store.(Parker)
	if !ok {
		return
	}
	if c.cfg.Owner != nil {
		limit.Owned = owned
	}
	if !time.Now().Before(until) {
		p.Forget() // the hold's validity is spent: the next claims park it
		return
	}
	pctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	ps, err := p.WriteParked(pctx, limit)
	if err == nil || errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	c.logger.Warn("could not park events the claim read; the next claim reads them again", "error", err)
	if c.cfg.Owner != nil {
		c.cfg.Owner.Wrote(ps, time.Until(until), err)
	}
}
