package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// errHeldBack is the outcome of an event that was not published because
// an earlier event of its aggregate in the same batch was not confirmed:
// it goes back to NEW with its attempt refunded, to wait behind that one.
var errHeldBack = errors.New("held back: an earlier event of its aggregate in the batch was not published")

// planRounds splits a batch, sorted in claim order, into rounds: round r
// holds the r-th event of every ordering key in the batch, and round 0
// also holds every event without a key. keys[i] is event i's key, "" for
// none. Publishing round by round, each after the previous one's confirms
// (and returns) are in, no event can reach the broker before an earlier
// event of its aggregate has been confirmed.
func planRounds(claimed []events.Claimed) (rounds [][]int, keys []string) {
	keys = make([]string, len(claimed))
	seen := map[string]int{}
	for i, c := range claimed {
		r := 0
		if key, ok := events.OrderingKey(c.Doc); ok {
			keys[i] = key
			r = seen[key]
			seen[key]++
		}
		for len(rounds) <= r {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], i)
	}
	return rounds, keys
}

// publishInRounds publishes the batch round by round (planRounds). An
// event whose publish failed, or that could not become a message, stops
// its key: the key's later events are not published and get errHeldBack.
// Events without a key never stop anything. ctx bounds all the rounds,
// and no round starts once deadline has come (see publishDeadline): its
// events and those of every later round are not published.
func (c *Claimer) publishInRounds(ctx context.Context, claimed []events.Claimed, msgs []*events.Message, outcomes []outcome, deadline time.Time) {
	rounds, keys := planRounds(claimed)
	stopped := map[string]bool{}
	for r, round := range rounds {
		if c.pastDeadline(deadline, slices.Concat(rounds[r:]...), outcomes) {
			return
		}
		batch := make([]events.Message, 0, len(round))
		sent := make([]int, 0, len(round))
		for _, i := range round {
			key := keys[i]
			switch {
			case key != "" && stopped[key]:
				outcomes[i].err = errHeldBack
				continue
			case outcomes[i].err != nil: // not a valid message
				if key != "" {
					stopped[key] = true
				}
				continue
			}
			batch = append(batch, *msgs[i])
			sent = append(sent, i)
		}
		if len(batch) == 0 {
			continue
		}
		errs := c.publishMessages(ctx, batch)
		confirmedAt := c.now()
		for j, err := range errs {
			i := sent[j]
			outcomes[i].err = err
			if err == nil {
				c.metrics.PublishLatency.Observe(confirmedAt.Sub(batch[j].Timestamp).Seconds())
			} else if keys[i] != "" {
				stopped[keys[i]] = true
			}
		}
	}
}

// publish publishes a batch (claimed, in publish order, with its messages
// and outcomes) within ctx and until deadline: first, alone, the suspect of a timeout that
// timeouts.isolate chooses, if any, with the whole of ctx's time to itself;
// then the rest, in rounds or all at once. It returns the index of the
// event published alone, or -1.
func (c *Claimer) publish(ctx context.Context, claimed []events.Claimed, msgs []*events.Message, outcomes []outcome, deadline time.Time) int {
	alone := c.timeouts.isolate(claimed, msgs, outcomes, c.ordered())
	if alone >= 0 && c.pastDeadline(deadline, []int{alone}, outcomes) {
		alone = -1 // not published: it goes back to NEW with the rest
	}
	var aloneErr error
	if alone >= 0 {
		aloneErr = c.publishMessages(ctx, []events.Message{*msgs[alone]})[0]
		if aloneErr == nil {
			c.metrics.PublishLatency.Observe(c.now().Sub(msgs[alone].Timestamp).Seconds())
		}
		outcomes[alone].err = errPublishedAlone
	}
	if c.ordered() {
		c.publishInRounds(ctx, claimed, msgs, outcomes, deadline)
	} else {
		c.publishAll(ctx, msgs, outcomes, deadline)
	}
	if alone >= 0 {
		outcomes[alone].err = aloneErr
	}
	return alone
}

// staleMarginDivisor makes the publish deadline's margin StaleAfter
// divided by it: 3 s at the default 60 s, the ownership margin (a tenth of
// a term of half the stale threshold). It covers the offset of the
// recovering replica's clock and the way of the last round to the broker.
const staleMarginDivisor = 20

// publishDeadline is when the publish of a batch whose claim's write
// started at wrote (on Config.Local) must stop: the earlier of
// PublishTimeout from now and the moment recovery could take the claim
// back, StaleAfter after it, less a margin. Its events may be in another
// worker's hands after that, and its later events already published: a
// worker that paused between its claim and its publish (SIGSTOP, a VM
// migration, a long GC) would otherwise publish the whole batch late,
// behind its successors.
func (c *Claimer) publishDeadline(wrote time.Time) time.Time {
	now := c.cfg.Local()
	stale := wrote.Add(c.cfg.StaleAfter - c.cfg.StaleAfter/staleMarginDivisor)
	if timeout := now.Add(c.cfg.PublishTimeout); timeout.Before(stale) {
		return timeout
	}
	return stale
}

// errPastDeadline is the outcome of an event not published because the
// batch's publish deadline had passed (see publishDeadline): it goes back
// to NEW with its attempt refunded, as an unconfirmed event does, if the
// claim is still this worker's.
var errPastDeadline = fmt.Errorf("%w: not sent: the batch's publish deadline passed (its claim may have been recovered)", events.ErrUnconfirmed)

// pastDeadline reports whether deadline has come, and if so gives every
// event of idx that has no outcome yet errPastDeadline and logs it.
func (c *Claimer) pastDeadline(deadline time.Time, idx []int, outcomes []outcome) bool {
	late := c.cfg.Local().Sub(deadline)
	if late < 0 {
		return false
	}
	n := 0
	for _, i := range idx {
		if outcomes[i].err == nil {
			outcomes[i].err = errPastDeadline
			n++
		}
	}
	if n > 0 {
		c.logger.Warn("events of a batch not published: its publish deadline passed (a pause, or a slow publish); they go back to NEW unless recovery took them",
			"events", n, "late_by", late)
	}
	return true
}

// relay publishes a claimed batch until deadline (publishDeadline) and
// writes every outcome.
func (c *Claimer) relay(ctx context.Context, lease events.Lease, claimed []events.Claimed, deadline time.Time) error {
	if c.ordered() {
		slices.SortStableFunc(claimed, func(a, b events.Claimed) int { return events.CompareOrder(a.Doc, b.Doc) })
		// An aggregate's events that carry its version go in its order,
		// whatever the clocks that stamped their createdAt.
		events.SortBySequence(claimed, func(c events.Claimed) bson.Raw { return c.Doc })
	}
	outcomes := make([]outcome, len(claimed))
	msgs := make([]*events.Message, len(claimed))
	for i, cl := range claimed {
		outcomes[i] = outcome{id: cl.ID, attempts: cl.Attempts}
		m, err := c.cfg.Format.NewMessage(cl.Doc, c.cfg.MaxBodyBytes)
		if err != nil {
			outcomes[i].err = err
			continue
		}
		if m.TraceDropped {
			c.metrics.TraceDropped.Inc()
		}
		msgs[i] = &m
	}

	pubCtx, cancel := context.WithTimeout(ctx, deadline.Sub(c.cfg.Local()))
	alone := c.publish(pubCtx, claimed, msgs, outcomes, deadline)
	// A deadline that cut the publish short makes its unconfirmed events
	// suspects. It is nearly always the publish timeout; the claim's
	// staleness comes first only after a pause, and a suspect fails only
	// after timing out alone (TimeoutsAloneMax), which a pause does not
	// repeat.
	c.timeouts.note(msgs, outcomes, alone, errors.Is(pubCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil)
	cancel()
	confirmedAt := c.now()
	settleCtx, cancel := c.settleContext(ctx, lease)
	defer cancel()
	settleCtx, end := c.trace.startSettle(settleCtx, claimed, outcomes)
	err := c.settle(settleCtx, lease, outcomes, confirmedAt.UTC())
	end(err)
	return err
}

// publishAll publishes the valid messages of a batch in one pipelined
// call, without regard to order (OrderingNone), unless deadline has
// passed.
func (c *Claimer) publishAll(ctx context.Context, msgs []*events.Message, outcomes []outcome, deadline time.Time) {
	batch := make([]events.Message, 0, len(msgs))
	sent := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if m != nil && outcomes[i].err == nil { // not published alone already
			batch = append(batch, *m)
			sent = append(sent, i)
		}
	}
	if c.pastDeadline(deadline, sent, outcomes) {
		return
	}
	errs := c.publishMessages(ctx, batch)
	confirmedAt := c.now()
	for j, err := range errs {
		outcomes[sent[j]].err = err
		if err == nil {
			c.metrics.PublishLatency.Observe(confirmedAt.Sub(batch[j].Timestamp).Seconds())
		}
	}
}
