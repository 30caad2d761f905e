package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/schedule"
)

// Store is the outbox as the claimer needs it.
type Store interface {
	// ReadClaimable reads the events a claim at now may take, up to
	// limit, in order; more reports that it stopped at a bound of limit.
	ReadClaimable(ctx context.Context, now time.Time, limit events.ClaimLimit) (docs []bson.Raw, more bool, err error)
	// ClaimRead claims for lease the documents ReadClaimable returned (or
	// a prefix of them). Its result lists the events claimed, and those
	// it refused and wrote FAILED.
	ClaimRead(ctx context.Context, lease events.Lease, docs []bson.Raw, limit events.ClaimLimit) (events.ClaimResult, error)
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
	// Hold returns the tenure of each partition this worker may claim in
	// now (events.Partitions entries, 0 where it may not; a tenure that
	// differs between two Holds changed hands in between), how long it
	// may, and a function to call once the claim's writes are done; no
	// partition is given away in between.
	Hold() (tenures []int64, validFor time.Duration, done func())
	// Renew renews the partitions held, for a write that needs more time
	// than Hold has left. Not called while a Hold is in progress.
	Renew(ctx context.Context) error
	// Wrote reports how a claim's write in partitions ended, before the
	// Hold it ran under is done: an error that is not the fence's leaves
	// the write in doubt (the server may still apply it until its own
	// deadline, landBy from now: the driver sends it as maxTimeMS, and an
	// error may come back long before it), and the owner does not give
	// those partitions away while it may land; an
	// *events.FencedError, from the write or the read, names partitions
	// another worker holds under a later tenure, which the owner drops.
	Wrote(partitions []int, landBy time.Duration, err error)
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
	// idle is since when claims find nothing: the schedule backs off.
	idle idleSince
	// batch sizes claims after the database's timeouts, and writes times
	// the claims' writes so that the fence gives them what they need.
	batch  *batchLimit
	writes writeTimes
	reads  recentTimes
	renews recentTimes
	// timeouts publishes alone the events whose publish timed out, and
	// fails those that time out alone (see TimeoutsAloneMax).
	timeouts timeouts
	// trace starts the relay's spans when tracing is on.
	trace tracing
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
			workerID:    cfg.WorkerID,
			maxAttempts: cfg.MaxAttempts,
			retryMin:    cfg.RetryMin,
			retryMax:    cfg.RetryMax,
			jitter:      backoff.Jitter,
		},
		now:       cfg.Now,
		halted:    make(chan struct{}),
		stopping:  make(chan struct{}),
		abandoned: abandonedLeases{staleAfter: cfg.StaleAfter},
		batch:     newBatchLimit(cfg.BatchSize),
	}
	c.trace = newTracing(cfg, pub)
	c.metrics.ClaimBatchLimit.Set(float64(cfg.BatchSize))
	var err error
	c.job, err = schedule.New(schedule.Config{Name: "claim", Schedule: cfg.Schedule, Run: c.runOnce, Logger: cfg.Logger,
		IdleSince: c.idle.get, IdleMax: cfg.IdleMax})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Start starts claiming on the schedule and returns.
func (c *Claimer) Start(ctx context.Context) error { return c.job.Start(ctx) }

// Trigger runs a claim as soon as the one in flight, if any, is over.
func (c *Claimer) Trigger() { c.job.Trigger() }

// Wake is Trigger unless claims are backing off after failed runs: then
// it runs nothing early and returns how long the backoff has left (see
// schedule.Job.Wake). For requests from outside the worker.
func (c *Claimer) Wake() (backoffLeft time.Duration) { return c.job.Wake() }

// IdleSince is since when this worker's claims have found nothing to
// claim (the schedule backs off meanwhile), zero while they find events.
func (c *Claimer) IdleSince() time.Time { return c.idle.get() }

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
		return fmt.Errorf("the batch in flight did not settle in time; what it still held stays PROCESSING until recovery: %w", ctx.Err())
	}
	// A claim that failed in the last run leaves nothing behind it.
	c.abandoned.flush(ctx, c.store, c.now(), c.logger)
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
	// Only a claim that read the outbox and found nothing keeps the
	// schedule backing off (see idleSince); any other outcome ends it.
	empty := false
	defer func() { c.idle.note(empty, c.cfg.Local()) }()
	// The events of a claim that failed go back to NEW whether or not
	// the broker is ready: releasing them needs only the database, and
	// left PROCESSING they would wait for recovery and lose an attempt.
	c.abandoned.retry(ctx, c.store, c.now(), c.logger)
	if err := c.pub.Ready(); err != nil {
		c.paused.log(c.logger, err)
		c.metrics.ClaimRuns.WithLabelValues(metrics.ClaimPaused).Inc()
		return false, nil
	}
	c.paused.resume(c.logger)
	lease := events.Lease{WorkerID: c.cfg.WorkerID, Token: newToken()}
	start := time.Now()
	res, wrote, err := c.claim(ctx, &lease)
	claimTook := time.Since(start)
	if !errors.Is(err, errUnowned) {
		c.trace.recordClaim(ctx, start, start.Add(claimTook), res, err)
	}
	c.draining.Store(err == nil && res.More)
	if errors.Is(err, errUnowned) {
		c.metrics.ClaimRuns.WithLabelValues(metrics.ClaimUnowned).Inc()
		return false, nil
	}
	if errors.Is(err, events.ErrFenced) {
		// Another worker holds a partition of this claim under a later
		// tenure, whatever this worker's clocks say: nothing of the claim
		// was written (a write that failed part-way before the fenced one
		// is put back), nothing is published, and the store leaves the
		// partition out of the next reads until the ownership round drops
		// it.
		c.metrics.ClaimFenced.Inc()
		c.metrics.ClaimRuns.WithLabelValues(metrics.ClaimUnowned).Inc()
		c.logger.Warn("claim refused by the database's fence: another worker took a partition this worker still held; nothing of it is published",
			"error", err)
		if !lease.At.IsZero() {
			c.abandoned.retry(ctx, c.store, c.now(), c.logger)
		}
		return false, nil
	}
	if err != nil {
		c.metrics.ClaimRuns.WithLabelValues(metrics.ClaimError).Inc()
		c.metrics.JobErrors.WithLabelValues("claim").Inc()
		if isTimeout(err) {
			c.shrink("claim", err)
		}
		if !lease.At.IsZero() { // the write began: it may have claimed some
			c.abandoned.retry(ctx, c.store, c.now(), c.logger)
		}
		return false, fmt.Errorf("claim batch: %w", err)
	}
	c.noteRejected(res.Rejected)
	claimed, full := res.Claimed, res.More
	c.metrics.ClaimBatchLimit.Set(float64(c.batch.succeeded(len(claimed)+len(res.Rejected), !full)))
	empty = len(claimed)+len(res.Rejected) == 0 && !full
	if len(claimed) == 0 {
		c.metrics.ClaimRuns.WithLabelValues(metrics.ClaimIdle).Inc()
		return full, nil
	}
	c.metrics.Claimed.Add(float64(len(claimed)))
	c.metrics.ClaimBatchSize.Observe(float64(len(claimed)))
	start = time.Now()
	if err := c.relay(ctx, lease, claimed, c.publishDeadline(wrote)); err != nil {
		c.metrics.ClaimRuns.WithLabelValues(metrics.ClaimError).Inc()
		c.metrics.JobErrors.WithLabelValues("claim").Inc()
		return false, err
	}
	c.metrics.ClaimRuns.WithLabelValues(metrics.ClaimClaimed).Inc()
	c.logger.Debug("batch relayed", "events", len(claimed), "claim_took", claimTook, "relay_took", time.Since(start),
		"batch_limit", c.batch.get())
	return full, nil
}

// errUnowned is claim's answer while this worker owns no partition: it
// read nothing. Not a failure of the claim, but not a claim either, and
// counted apart (claim_runs_total{result="unowned"}), so that a relay whose
// replicas own nothing is seen.
var errUnowned = errors.New("no partition owned")

// shrink halves the batch limit after a timeout (see batchLimit).
func (c *Claimer) shrink(what string, err error) {
	n := c.batch.timedOut()
	c.metrics.ClaimBatchLimit.Set(float64(n))
	c.logger.Warn("database timed out; claiming smaller batches", "operation", what, "batch_limit", n, "error", err)
}

// BatchLimit is how many events the next claim may take: Config.BatchSize
// unless the database timed out lately (see batchLimit).
func (c *Claimer) BatchLimit() int { return c.batch.get() }

// Slow reports whether the database is slowing claims down: the batch
// limit is below Config.BatchSize after a timeout. Periodic work that can
// wait (sampling, recovery, retention) yields to the relay meanwhile.
func (c *Claimer) Slow() bool { return c.batch.get() < c.cfg.BatchSize }

// ordered reports whether batches are claimed and published in order.
func (c *Claimer) ordered() bool { return c.cfg.Ordering == OrderingAggregate }

// claim claims a batch in the partitions this worker owns, and sets
// lease.At to the time of its write (processingAt). It also returns the
// local instant read just before lease.At (wrote), from which the batch's
// publish deadline counts. It returns errUnowned, having read nothing,
// when the worker owns none.
//
// It reads in the partitions owned when it starts, for as long as the
// stale threshold at most. Then it holds the partitions again, keeps only
// the events of those owned since before the read without a break, and
// writes within the validity it finds: no partition is given away until
// the write returns (the fence). A write is not started unless the
// validity covers it, by the write times seen lately (writeTimes): where
// the validity will not cover the read and the write, the claim renews
// the partitions beside its read; before the write it renews again if it
// must, and then takes fewer events if it must.
func (c *Claimer) claim(ctx context.Context, lease *events.Lease) (res events.ClaimResult, wrote time.Time, err error) {
	limit := events.ClaimLimit{
		Events:      c.batch.get(),
		Bytes:       c.cfg.BatchBytes,
		Ordered:     c.ordered(),
		FailedHolds: c.cfg.AfterFailed == AfterFailedWait,
		Draining:    c.draining.Load(),
	}
	if limit.Ordered {
		limit.Held = c.abandoned.held(c.now())
	}
	var before []int64
	var renewal *renewal
	if c.cfg.Owner != nil {
		var validFor time.Duration
		var done func()
		before, validFor, done = c.cfg.Owner.Hold()
		done()
		if validFor <= 0 || !slices.ContainsFunc(before, func(t int64) bool { return t != 0 }) {
			return events.ClaimResult{}, time.Time{}, errUnowned
		}
		limit.Owned = sameTerms(before, before)
		// The store checks the tenures on the server where it can (the
		// fence of the claim's transaction, see events.ErrFenced).
		limit.Tenures = before
		// A renewal the write would wait for runs beside the read, timed
		// to end with it: started at once, it ended long before a slow
		// read, whose time then came off the renewed validity, and the
		// fence renewed again in the write's path.
		shortest, longest := c.readTimes()
		if validFor < longest+c.writes.need(limit.Events, shortest) {
			renewal = c.renewBeside(ctx, shortest-c.renewTime())
		}
	}
	readCtx, cancel := context.WithTimeout(ctx, c.cfg.StaleAfter)
	start := time.Now()
	docs, more, err := c.store.ReadClaimable(readCtx, c.now(), limit)
	c.reads.observe(time.Since(start))
	cancel()
	renewedBeside := false
	if renewal != nil {
		rerr := renewal.wait()
		if rerr != nil && !errors.Is(rerr, errRenewalLeftOut) {
			c.logger.Warn("could not renew the partitions during a claim's read", "error", rerr)
		}
		renewedBeside = rerr == nil
	}
	if errors.Is(err, events.ErrFenced) && c.cfg.Owner != nil {
		c.cfg.Owner.Wrote(nil, 0, err) // the read's raise of a fence was refused
	}
	if err != nil {
		return events.ClaimResult{More: more}, time.Time{}, err
	}
	docs, owned, validFor, done := c.fence(ctx, before, docs, renewedBeside)
	defer done()
	// Last, and still under the hold: the parks the read found.
	defer c.writeParked(ctx, limit, owned, time.Now().Add(validFor))
	if len(docs) == 0 {
		return events.ClaimResult{More: more}, time.Time{}, nil
	}
	// The local instant first: the lease may be recovered StaleAfter after
	// lease.At, and the publish deadline counts from no later than that.
	wrote = c.cfg.Local()
	lease.At = c.now().UTC().Truncate(time.Millisecond)
	writeCtx, cancel := context.WithTimeout(ctx, validFor)
	defer cancel()
	start = time.Now()
	res, err = c.store.ClaimRead(writeCtx, *lease, docs, limit)
	c.writes.observe(len(docs), time.Since(start))
	if err != nil {
		// The write may still land until its own deadline, however early
		// its error came back.
		deadline, _ := writeCtx.Deadline()
		landBy := time.Until(deadline)
		c.abandoned.add(*lease, orderingKeys(docs), c.now(), landBy)
		if c.cfg.Owner != nil {
			// Before the hold ends: a write in doubt keeps its partitions
			// from being given away until it can no longer land.
			c.cfg.Owner.Wrote(docPartitions(docs), landBy, err)
		}
	}
	res.More = more
	return res, wrote, err
}
