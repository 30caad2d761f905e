package claim

import (
	"context"
	"errors"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/metrics"
)

// settleContext bounds the writes that record a batch's outcome. They go
// on when shutdown cancels ctx, because a confirmed event left PROCESSING
// would be published again; they go on through a database outage until the
// lease could be taken back, since after that a fenced write may match
// nothing; and they give up when a stop's time is up.
func (c *Claimer) settleContext(ctx context.Context, lease events.Lease) (context.Context, context.CancelFunc) {
	// The lease is timed by Config.Now (the server's clock); a context's
	// deadline by the local one: carry over what is left of the lease.
	settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease.At.Add(c.cfg.StaleAfter).Sub(c.now()))
	go func() {
		select {
		case <-c.halted:
			cancel()
		case <-settleCtx.Done():
		}
	}()
	return settleCtx, cancel
}

func (c *Claimer) settle(ctx context.Context, lease events.Lease, outcomes []outcome, now time.Time) error {
	published, releases := c.policy.plan(outcomes, now)
	var errs []error
	if len(published) > 0 {
		n, exact, err := c.retryWrite(ctx, func(ctx context.Context) (int, error) {
			return c.store.MarkPublished(ctx, lease, published, now.Truncate(time.Millisecond))
		})
		if err != nil {
			errs = append(errs, err)
		}
		c.metrics.Published.Add(float64(n))
		c.noteLost(len(published), n, exact, "mark published")
	}
	for _, r := range releases {
		n, exact, err := c.retryWrite(ctx, func(ctx context.Context) (int, error) {
			return c.store.Release(ctx, lease, r.Release)
		})
		if err != nil {
			errs = append(errs, err)
		}
		if r.Status == events.StatusFailed {
			c.metrics.Failed.WithLabelValues(r.reason).Add(float64(n))
			c.logger.Warn("events failed", "count", n, "reason", r.reason, "last_error", r.LastError)
		} else {
			c.metrics.Released.WithLabelValues(r.reason).Add(float64(n))
			c.logger.Info("events released to NEW", "count", n, "reason", r.reason,
				"refund", r.Refund, "retry_at", r.RetryAt, "last_error", r.LastError)
		}
		c.noteLost(len(r.IDs), n, exact, "release")
	}
	return errors.Join(errs...)
}

// retryWrite runs a fenced outcome write until it succeeds or ctx ends. A
// database blip must not leave a confirmed event PROCESSING, to be
// published again after recovery. The writes are idempotent (fenced on
// status PROCESSING), so a retry after a write that did land changes
// nothing; its count is then not the whole count, which exact reports. A
// write that times out makes the next claim smaller (see batchLimit), once.
func (c *Claimer) retryWrite(ctx context.Context, write func(context.Context) (int, error)) (n int, exact bool, err error) {
	wait := backoff.Backoff{Min: writeRetryMin, Max: writeRetryMax}
	shrunk := false
	for attempt := 0; ; attempt++ {
		n, err = write(ctx)
		if err == nil {
			return n, attempt == 0, nil
		}
		if isTimeout(err) && !shrunk {
			c.shrink("outcome write", err)
			shrunk = true
		}
		if !backoff.Sleep(ctx, wait.Next()) {
			return 0, false, err
		}
	}
}

// noteLost counts events whose fenced write matched nothing: recovery had
// reset them and another worker may hold them now. For a confirmed event
// that is the one way a duplicate delivery arises; it is expected only when
// a publish took longer than the stale threshold. After a retried write the
// count is not exact, and nothing is concluded.
func (c *Claimer) noteLost(want, got int, exact bool, what string) {
	if !exact || got >= want {
		return
	}
	c.metrics.LostClaims.Add(float64(want - got))
	c.logger.Warn("claims lost before "+what+"; another worker may deliver these events again",
		"lost", want-got, "of", want)
}

// rejectLogIDs bounds the event ids one log line of rejects names.
const rejectLogIDs = 10

// noteRejected counts and logs the events a claim refused: one line per
// claim, outcome and reason, naming at most rejectLogIDs of them. Each such
// event is written FAILED once, so these lines are as rare as bad documents.
func (c *Claimer) noteRejected(rejected []events.Rejected) {
	type key struct {
		outcome int // rejectFailed, rejectUnwritten or rejectSkipped
		reason  string
	}
	type group struct {
		ids   []any
		count int
		err   error
	}
	groups := map[key]*group{}
	var order []key
	for _, r := range rejected {
		k := key{rejectFailed, r.LastError}
		switch {
		case r.Skipped:
			k.outcome = rejectSkipped
			c.metrics.Skipped.Inc()
		case r.Err != nil:
			k.outcome = rejectUnwritten
			c.metrics.Unwritable.Inc()
		default:
			c.metrics.Failed.WithLabelValues(metrics.ReasonInvalid).Inc()
		}
		g, ok := groups[k]
		if !ok {
			g = &group{err: r.Err}
			groups[k] = g
			order = append(order, k)
		}
		g.count++
		if len(g.ids) < rejectLogIDs {
			g.ids = append(g.ids, r.ID)
		}
	}
	for _, k := range order {
		g := groups[k]
		switch k.outcome {
		case rejectSkipped:
			c.logger.Error("events skipped: too close to the document size limit for any write; this worker leaves them NEW until it restarts",
				"count", g.count, "event_ids", g.ids, "reason", k.reason, "error", g.err)
		case rejectUnwritten:
			c.logger.Warn("events refused by the claim could not be marked failed; the next claim tries again",
				"count", g.count, "event_ids", g.ids, "reason", k.reason, "error", g.err)
		default:
			c.logger.Warn("events failed at claim", "count", g.count, "event_ids", g.ids, "reason", k.reason)
		}
	}
}

// What became of an event a claim refused.
const (
	rejectFailed    = iota // written FAILED
	rejectUnwritten        // the FAILED write failed; tried again next claim
	rejectSkipped          // no write fits; skipped by this worker
)
