package claim

import (
	"context"
	"errors"
	"slices"
	"time"

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
