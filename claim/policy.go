package claim

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/metrics"
)

// outcome is what became of one claimed event's publish.
type outcome struct {
	id       any
	attempts int
	err      error // nil: confirmed
}

// release is one write that moves events out of PROCESSING, with the
// metrics reason it counts under.
type release struct {
	events.Release
	reason string
}

const (
	// RetryMinDefault is the delay before the first retry of a failed publish.
	RetryMinDefault = time.Second
	// RetryMaxDefault caps the delay between retries.
	RetryMaxDefault = 5 * time.Minute
)

// policy decides what a failed publish means for its event: the retry
// policy of the claimer.
type policy struct {
	workerID           string // on the attempts it records
	maxAttempts        int
	retryMin, retryMax time.Duration
	// jitter spreads a retry delay; backoff.Jitter outside tests.
	jitter func(time.Duration) time.Duration
}

// retryDelay is the wait before the next claim of an event whose publish
// failed on its n-th attempt: retryMin doubled for each attempt after the
// first, capped at retryMax, then jittered so that batches and replicas
// that failed together do not retry together (the events of one batch
// share a delay, so that their release is one write).
func (p policy) retryDelay(n int) time.Duration {
	return p.jitter(backoff.Delay(max(n-1, 0), p.retryMin, p.retryMax))
}

// plan splits outcomes into the ids to mark PUBLISHED and the releases for
// the rest, grouped so that each group is one write:
//   - a poison event (events.InvalidError, or events.ErrRejected: the
//     broker closed the channel on it even when published alone) fails at
//     once;
//   - an event held back behind an earlier event of its aggregate in the
//     batch (errHeldBack) goes back to NEW with its attempt refunded;
//   - a broker outage or a missing confirm puts the event back to NEW at
//     once and refunds the attempt: it was not the event's fault, until
//     the event has timed out TimeoutsAloneMax times published alone
//     (errTimedOutAlone): then it fails;
//   - a nack or a return retries later with backoff, until maxAttempts
//     claims have been used; then the event fails.
func (p policy) plan(outcomes []outcome, now time.Time) (published []any, releases []release) {
	groups := map[string]*release{}
	var order []string
	add := func(key string, r release, id any) {
		g, ok := groups[key]
		if !ok {
			g = &r
			groups[key] = g
			order = append(order, key)
		}
		g.IDs = append(g.IDs, id)
	}
	// Events with the same attempt count share one retry time, so a batch
	// that failed together costs one write per attempt count.
	retryAts := map[int]time.Time{}
	retryAt := func(attempts int) time.Time {
		t, ok := retryAts[attempts]
		if !ok {
			t = now.Add(p.retryDelay(attempts)).Truncate(time.Millisecond)
			retryAts[attempts] = t
		}
		return t
	}
	for _, o := range outcomes {
		if o.err == nil {
			published = append(published, o.id)
			continue
		}
		r := p.decide(o, retryAt)
		if !r.Refund {
			// The attempt counted: the event's history says why it failed.
			r.Attempt = &events.AttemptError{At: now.Truncate(time.Millisecond), WorkerID: p.workerID, Reason: r.reason, Error: r.LastError}
		}
		key := fmt.Sprintf("%s|%s|%t|%d|%s", r.Status, r.reason, r.Refund, r.RetryAt.UnixNano(), r.LastError)
		add(key, r, o.id)
	}
	for _, k := range order {
		releases = append(releases, *groups[k])
	}
	return published, releases
}

func (p policy) decide(o outcome, retryAt func(attempts int) time.Time) release {
	var invalid *events.InvalidError
	switch {
	case errors.As(o.err, &invalid):
		return release{events.Release{Status: events.StatusFailed, LastError: o.err.Error()}, metrics.ReasonInvalid}
	case errors.Is(o.err, events.ErrRejected):
		return release{events.Release{Status: events.StatusFailed, LastError: o.err.Error()}, metrics.ReasonRejected}
	case errors.Is(o.err, errTimedOutAlone):
		return release{events.Release{Status: events.StatusFailed, LastError: o.err.Error()}, metrics.ReasonTimeout}
	case errors.Is(o.err, events.ErrUnavailable):
		return release{events.Release{Status: events.StatusNew, LastError: o.err.Error(), Refund: true}, metrics.ReasonBrokerUnavailable}
	case errors.Is(o.err, errHeldBack):
		return release{events.Release{Status: events.StatusNew, LastError: o.err.Error(), Refund: true}, metrics.ReasonHeldBack}
	case errors.Is(o.err, events.ErrUnconfirmed):
		return release{events.Release{Status: events.StatusNew, LastError: o.err.Error(), Refund: true}, metrics.ReasonUnconfirmed}
	}
	if o.attempts >= p.maxAttempts {
		msg := fmt.Sprintf("gave up after %d attempts: %v", o.attempts, o.err)
		return release{events.Release{Status: events.StatusFailed, LastError: msg}, metrics.ReasonMaxAttempts}
	}
	reason := metrics.ReasonError
	switch {
	case errors.Is(o.err, events.ErrNacked):
		reason = metrics.ReasonNacked
	case errors.Is(o.err, events.ErrReturned):
		reason = metrics.ReasonReturned
	}
	return release{events.Release{Status: events.StatusNew, LastError: o.err.Error(), RetryAt: retryAt(o.attempts)}, reason}
}
