package claim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/schedule"
)

// Store is the outbox as the claimer needs it.
type Store interface {
	// Claim claims events for lease, up to limit. Its result also lists
	// the events it refused and wrote FAILED, and whether more may be
	// waiting.
	Claim(ctx context.Context, lease events.Lease, limit events.ClaimLimit) (events.ClaimResult, error)
	MarkPublished(ctx context.Context, lease events.Lease, ids []any, at time.Time) (int, error)
	Release(ctx context.Context, lease events.Lease, r events.Release) (int, error)
	// Abandon puts every event lease holds back to NEW with its attempt
	// refunded: for a claim that failed part-way.
	Abandon(ctx context.Context, lease events.Lease) (int, error)
}

// Publisher is the broker as the claimer needs it.
type Publisher interface {
	// Ready returns nil when a publish can succeed, or why not.
	Ready() error
	// Publish returns one error per message, nil for a confirmed one.
	Publish(ctx context.Context, msgs []events.Message) []error
}

// Owner is the partition ownership as the claimer needs it.
type Owner interface {
	// Hold returns the term of each partition this worker may claim in
	// now (events.Partitions entries, 0 where it may not), how long it
	// may, and a function to call once the claim's writes are done; no
	// partition is given away in between.
	Hold() (terms []int64, validFor time.Duration, done func())
}

// Claimer claims, publishes and marks batches of events on a schedule.
type Claimer struct {
	cfg     Config
	store   Store
	pub     Publisher
	logger  *slog.Logger
	metrics *metrics.Metrics
	policy  policy
	job     *schedule.Job
	now     func() time.Time
	paused  pauseLog
	// abandoned are the leases of claims that failed part-way.
	abandoned abandonedLeases
	// draining is whether the last claim stopped at a bound
	// (events.ClaimLimit.Draining).
	draining atomic.Bool
	// halted is closed when a stop's deadline has passed: the outcome
	// writes of the batch in flight give up then.
	halted   chan struct{}
	haltOnce sync.Once
	// stopping is closed when Stop is called: no claim starts after it,
	// even in a drain of a backlog that reported more.
	stopping chan struct{}
	stopOnce sync.Once
}

// New returns a Claimer; Start runs it.
func New(store Store, pub Publisher, cfg Config) (*Claimer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Claimer{
		cfg:     cfg,
		store:   store,
		pub:     pub,
		logger:  cfg.Logger,
		metrics: cfg.Metrics,
		policy: policy{
			maxAttempts: cfg.MaxAttempts,
			retryMin:    cfg.RetryMin,
			retryMax:    cfg.RetryMax,
			jitter:      backoff.Jitter,
		},
		now:       cfg.Now,
		halted:    make(chan struct{}),
		stopping:  make(chan struct{}),
		abandoned: abandonedLeases{staleAfter: cfg.StaleAfter},
	}
	var err error
	c.job, err = schedule.New(schedule.Config{Name: "claim", Schedule: cfg.Schedule, Run: c.runOnce, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Start starts claiming on the schedule and returns.
func (c *Claimer) Start(ctx context.Context) error { return c.job.Start(ctx) }

// Trigger runs a claim as soon as the one in flight, if any, is over.
func (c *Claimer) Trigger() { c.job.Trigger() }

// LastRun is when the last successful claim run finished; zero before the
// first.
func (c *Claimer) LastRun() time.Time { return c.job.LastRun() }

// Stop stops claiming and lets the batch in flight finish: its confirms are
// awaited and its outcomes written. Near ctx's deadline, confirms still
// missing are given up and those events released to NEW, keeping a few
// seconds back for that write; when ctx ends, the writes give up too.
// Idempotent; safe before Start.
func (c *Claimer) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { close(c.stopping) })
	drain := ctx
	if deadline, ok := ctx.Deadline(); ok {
		reserve := min(settleReserve, time.Until(deadline)/3)
		var cancel context.CancelFunc
		drain, cancel = context.WithDeadline(ctx, deadline.Add(-reserve))
		defer cancel()
	}
	defer context.AfterFunc(ctx, c.halt)()
	if err := c.job.Stop(drain); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	// A claim that failed in the last run leaves nothing behind it.
	c.abandoned.retry(ctx, c.store, c.now(), c.logger)
	return nil
}

// halt ends the outcome writes of the batch in flight; see settleContext.
func (c *Claimer) halt() { c.haltOnce.Do(func() { close(c.halted) }) }

// runOnce claims one batch and carries it through. It reports more when a
// full batch was claimable, so the schedule drains a backlog without waiting
// a tick; that includes a batch other replicas won part or all of.
func (c *Claimer) runOnce(ctx context.Context) (more bool, err error) {
	select {
	case <-c.stopping:
		return false, nil
	default:
	}
	if err := c.pub.Ready(); err != nil {
		c.paused.log(c.logger, err)
		return false, nil
	}
	c.paused.resume(c.logger)
	lease := events.Lease{
		WorkerID: c.cfg.WorkerID,
		Token:    newToken(),
		At:       c.now().UTC().Truncate(time.Millisecond),
	}
	c.abandoned.retry(ctx, c.store, c.now(), c.logger)
	res, err := c.claim(ctx, lease)
	c.draining.Store(err == nil && res.More)
	if err != nil {
		c.metrics.JobErrors.WithLabelValues("claim").Inc()
		c.abandoned.add(lease, c.now())
		c.abandoned.retry(ctx, c.store, c.now(), c.logger)
		return false, fmt.Errorf("claim batch: %w", err)
	}
	c.noteRejected(res.Rejected)
	if !res.At.IsZero() {
		lease.At = res.At // the claim was written then
	}
	claimed, full := res.Claimed, res.More
	if len(claimed) == 0 {
		return full, nil
	}
	c.metrics.Claimed.Add(float64(len(claimed)))
	c.metrics.ClaimBatchSize.Observe(float64(len(claimed)))
	if err := c.relay(ctx, lease, claimed); err != nil {
		c.metrics.JobErrors.WithLabelValues("claim").Inc()
		return false, err
	}
	return full, nil
}

// ordered reports whether batches are claimed and published in order.
func (c *Claimer) ordered() bool { return c.cfg.Ordering == OrderingAggregate }

// claim claims a batch in the partitions this worker owns, if it owns
// any. It reads in the partitions owned when it starts, for as long as the
// stale threshold at most; its writes take only the events of partitions
// still owned under the same terms (none changed hands in between), and
// must land while they are: they are bounded by the partitions' validity,
// and no partition is given away until they return (the fence).
func (c *Claimer) claim(ctx context.Context, lease events.Lease) (events.ClaimResult, error) {
	limit := events.ClaimLimit{
		Events:      c.cfg.BatchSize,
		Bytes:       c.cfg.BatchBytes,
		Ordered:     c.ordered(),
		FailedHolds: c.cfg.AfterFailed == AfterFailedWait,
		Draining:    c.draining.Load(),
	}
	if c.cfg.Owner == nil {
		return c.store.Claim(ctx, lease, limit)
	}
	before, validFor, done := c.cfg.Owner.Hold()
	done()
	if validFor <= 0 || !slices.ContainsFunc(before, func(term int64) bool { return term != 0 }) {
		return events.ClaimResult{}, nil
	}
	limit.Owned = sameTerms(before, before)
	limit.Fence = func() events.WriteFence {
		now, validFor, done := c.cfg.Owner.Hold()
		wctx, cancel := context.WithTimeout(ctx, validFor)
		return events.WriteFence{
			Ctx:   wctx,
			Owned: sameTerms(before, now),
			At:    c.now().UTC().Truncate(time.Millisecond),
			Done:  func() { cancel(); done() },
		}
	}
	readCtx, cancel := context.WithTimeout(ctx, c.cfg.StaleAfter)
	defer cancel()
	return c.store.Claim(readCtx, lease, limit)
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

// relay publishes a claimed batch and writes every outcome.
func (c *Claimer) relay(ctx context.Context, lease events.Lease, claimed []events.Claimed) error {
	if c.ordered() {
		slices.SortStableFunc(claimed, func(a, b events.Claimed) int { return events.CompareOrder(a.Doc, b.Doc) })
	}
	outcomes := make([]outcome, len(claimed))
	msgs := make([]*events.Message, len(claimed))
	for i, cl := range claimed {
		outcomes[i] = outcome{id: cl.ID, attempts: cl.Attempts}
		m, err := events.NewMessage(cl.Doc, c.cfg.MaxBodyBytes)
		if err != nil {
			outcomes[i].err = err
			continue
		}
		msgs[i] = &m
	}

	pubCtx, cancel := context.WithTimeout(ctx, c.cfg.PublishTimeout)
	if c.ordered() {
		c.publishInRounds(pubCtx, claimed, msgs, outcomes)
	} else {
		c.publishAll(pubCtx, msgs, outcomes)
	}
	cancel()
	confirmedAt := c.now()
	settleCtx, cancel := c.settleContext(ctx, lease)
	defer cancel()
	return c.settle(settleCtx, lease, outcomes, confirmedAt.UTC())
}

// publishAll publishes the valid messages of a batch in one pipelined
// call, without regard to order (OrderingNone).
func (c *Claimer) publishAll(ctx context.Context, msgs []*events.Message, outcomes []outcome) {
	batch := make([]events.Message, 0, len(msgs))
	sent := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if m != nil {
			batch = append(batch, *m)
			sent = append(sent, i)
		}
	}
	errs := c.pub.Publish(ctx, batch)
	confirmedAt := c.now()
	for j, err := range errs {
		outcomes[sent[j]].err = err
		if err == nil {
			c.metrics.PublishLatency.Observe(confirmedAt.Sub(batch[j].Timestamp).Seconds())
		}
	}
}

func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pauseLog logs once when claiming pauses and once when it resumes, rather
// than on every tick of an outage.
type pauseLog struct{ paused bool }

func (p *pauseLog) log(logger *slog.Logger, why error) {
	if !p.paused {
		logger.Warn("claiming paused", "error", why)
		p.paused = true
	}
}

func (p *pauseLog) resume(logger *slog.Logger) {
	if p.paused {
		logger.Info("claiming resumed")
		p.paused = false
	}
}
