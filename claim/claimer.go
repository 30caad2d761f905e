package claim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
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

const (
	// ScheduleDefault is how often a worker claims.
	ScheduleDefault = "@every 1s"
	// BatchSizeDefault is how many events one claim takes at most.
	BatchSizeDefault = 500
	// BatchBytesDefault bounds the raw size of one claim's documents.
	BatchBytesDefault = 64 << 20
	// MaxAttemptsDefault is how many claims an event gets before FAILED.
	MaxAttemptsDefault = events.MaxAttemptsDefault
	// MaxBodyBytesDefault bounds a message body (RabbitMQ 4's default
	// max_message_size is 16 MiB).
	MaxBodyBytesDefault = 16 << 20
	// PublishTimeoutDefault bounds the wait for one batch's confirms.
	PublishTimeoutDefault = 30 * time.Second
	// StaleAfterDefault is how long a claim stands before recovery may take
	// it back: recovery.StaleAfterDefault.
	StaleAfterDefault = 60 * time.Second
	// OrderingAggregate publishes the events of one aggregate in order
	// (OUTBOX_ORDERING=aggregate): the default.
	OrderingAggregate = "aggregate"
	// OrderingNone publishes without regard to order (OUTBOX_ORDERING=none).
	OrderingNone = "none"
	// AfterFailedWait holds an aggregate's later events while an earlier
	// one is FAILED and not skipped (OUTBOX_ORDERING_AFTER_FAILED=wait):
	// the default.
	AfterFailedWait = "wait"
	// AfterFailedContinue lets them flow past a FAILED event.
	AfterFailedContinue = "continue"
	// writeRetryMin and writeRetryMax bound the backoff between tries of
	// an outcome write: short, since a confirmed event waits on it.
	writeRetryMin = 100 * time.Millisecond
	writeRetryMax = time.Second
	// settleReserve is the part of a stop's time kept back for writing the
	// outcome of the batch in flight once its confirms are given up.
	settleReserve = 5 * time.Second
)

// Config configures a Claimer.
type Config struct {
	// WorkerID names this worker on every claim. Required.
	WorkerID string
	// Schedule is the cron schedule of claims. Defaults to ScheduleDefault.
	Schedule string
	// BatchSize is the most events one claim takes. Defaults to BatchSizeDefault.
	BatchSize int
	// BatchBytes bounds the sum of the raw BSON sizes of the documents one
	// claim takes: the claim stops reading once the next document would
	// take the sum past it, except that it always takes one document, so
	// one batch holds at most BatchBytes or one document (up to 16 MiB).
	// The worker's memory for a batch peaks at about 4.5 times the bound
	// plus 20 MB (measured: 284 MB with 15 MiB documents at 64 MiB): the
	// raw documents, the message bodies made from them (relaxed Extended
	// JSON, about as large as the BSON for typical payloads, each capped
	// by MaxBodyBytes), the driver's reply buffers (at most 16 MiB of
	// documents per reply, see the mongo package), and the garbage
	// collector's headroom.
	// Defaults to BatchBytesDefault.
	BatchBytes int
	// MaxAttempts is how many claims an event gets before it becomes
	// FAILED. Defaults to MaxAttemptsDefault.
	MaxAttempts int
	// MaxBodyBytes bounds a message body; a larger event is FAILED.
	// Defaults to MaxBodyBytesDefault.
	MaxBodyBytes int
	// PublishTimeout bounds the wait for a batch's confirms; events still
	// unconfirmed then go back to NEW. Defaults to PublishTimeoutDefault.
	PublishTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between retries of a failed
	// publish. Default to RetryMinDefault and RetryMaxDefault.
	RetryMin, RetryMax time.Duration
	// StaleAfter is recovery's threshold (OUTBOX_STALE_AFTER): after it a
	// claim may be taken back and handed to another worker. The writes
	// that record a batch's outcome are retried until then, so that a
	// database outage or failover shorter than that costs no duplicate.
	// Must exceed PublishTimeout. Defaults to StaleAfterDefault.
	StaleAfter time.Duration
	// Ordering is OrderingAggregate: events with an aggregateId are
	// claimed and published in createdAt (then _id) order per aggregate,
	// a retried or held event holding back the later events of its
	// aggregate; or OrderingNone. Defaults to OrderingAggregate.
	Ordering string
	// AfterFailed is what a FAILED event means for the later events of its
	// aggregate when ordering: AfterFailedWait (they wait until it is
	// requeued or skipped) or AfterFailedContinue. Defaults to
	// AfterFailedWait.
	AfterFailed string
	// Owner, when set, says which partitions this worker may claim in
	// (ownership.Manager). Without it the worker claims in all, which is
	// right only for a single worker. Defaults to nil.
	Owner Owner
	// Now is the clock of leases and retry times; the worker passes the
	// database server's (mongo.Clock). Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics defaults to an unregistered set.
	Metrics *metrics.Metrics
}

// Owner is the partition ownership as the claimer needs it.
type Owner interface {
	// Hold returns the partitions this worker may claim in now
	// (events.Partitions entries), how long it may, and a function to
	// call once the claim is written.
	Hold() (owned []bool, validFor time.Duration, done func())
}

func (c *Config) setDefaults() {
	if c.Schedule == "" {
		c.Schedule = ScheduleDefault
	}
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = BatchBytesDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = MaxBodyBytesDefault
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = PublishTimeoutDefault
	}
	if c.RetryMin == 0 {
		c.RetryMin = RetryMinDefault
	}
	if c.RetryMax == 0 {
		c.RetryMax = RetryMaxDefault
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = StaleAfterDefault
	}
	if c.Ordering == "" {
		c.Ordering = OrderingAggregate
	}
	if c.AfterFailed == "" {
		c.AfterFailed = AfterFailedWait
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New(nil)
	}
}

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	switch {
	case c.WorkerID == "":
		return errors.New("worker id is empty")
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("batch size %d: want 1 to 10000", c.BatchSize)
	case c.BatchBytes < 1:
		return fmt.Errorf("batch bytes %d: want at least 1", c.BatchBytes)
	case c.MaxAttempts < 1:
		return fmt.Errorf("max attempts %d: want at least 1", c.MaxAttempts)
	case c.MaxBodyBytes < 1:
		return fmt.Errorf("max body bytes %d: want at least 1", c.MaxBodyBytes)
	case c.PublishTimeout <= 0:
		return fmt.Errorf("publish timeout %s: want more than 0", c.PublishTimeout)
	case c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return fmt.Errorf("retry backoff %s..%s: want 0 < min <= max", c.RetryMin, c.RetryMax)
	case c.StaleAfter <= c.PublishTimeout:
		return fmt.Errorf("stale after %s: want more than the publish timeout %s", c.StaleAfter, c.PublishTimeout)
	case c.Ordering != OrderingAggregate && c.Ordering != OrderingNone:
		return fmt.Errorf("ordering %q: want %s or %s", c.Ordering, OrderingAggregate, OrderingNone)
	case c.AfterFailed != AfterFailedWait && c.AfterFailed != AfterFailedContinue:
		return fmt.Errorf("ordering after failed %q: want %s or %s", c.AfterFailed, AfterFailedWait, AfterFailedContinue)
	}
	if _, err := schedule.Parse(c.Schedule); err != nil {
		return err
	}
	return nil
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
		return nil, fmt.Errorf("claim config: %w", err)
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
	c.job, err = schedule.New("claim", cfg.Schedule, c.runOnce, cfg.Logger)
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
	if err != nil {
		c.metrics.JobErrors.WithLabelValues("claim").Inc()
		c.abandoned.add(lease, c.now())
		c.abandoned.retry(ctx, c.store, c.now(), c.logger)
		return false, fmt.Errorf("claim batch: %w", err)
	}
	c.noteRejected(res.Rejected)
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
// any. The claim's write must land while the partitions are still owned:
// it is bounded by their validity, and no partition is given away until
// it returns.
func (c *Claimer) claim(ctx context.Context, lease events.Lease) (events.ClaimResult, error) {
	limit := events.ClaimLimit{
		Events:      c.cfg.BatchSize,
		Bytes:       c.cfg.BatchBytes,
		Ordered:     c.ordered(),
		FailedHolds: c.cfg.AfterFailed == AfterFailedWait,
	}
	if c.cfg.Owner == nil {
		return c.store.Claim(ctx, lease, limit)
	}
	owned, validFor, done := c.cfg.Owner.Hold()
	defer done()
	if validFor <= 0 || !slices.Contains(owned, true) {
		return events.ClaimResult{}, nil
	}
	limit.Owned = owned
	claimCtx, cancel := context.WithTimeout(ctx, validFor)
	defer cancel()
	return c.store.Claim(claimCtx, lease, limit)
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
		n, exact, err := retryWrite(ctx, func(ctx context.Context) (int, error) {
			return c.store.MarkPublished(ctx, lease, published, now.Truncate(time.Millisecond))
		})
		if err != nil {
			errs = append(errs, err)
		}
		c.metrics.Published.Add(float64(n))
		c.noteLost(len(published), n, exact, "mark published")
	}
	for _, r := range releases {
		n, exact, err := retryWrite(ctx, func(ctx context.Context) (int, error) {
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
// nothing; its count is then not the whole count, which exact reports.
func retryWrite(ctx context.Context, write func(context.Context) (int, error)) (n int, exact bool, err error) {
	wait := backoff.Backoff{Min: writeRetryMin, Max: writeRetryMax}
	for attempt := 0; ; attempt++ {
		n, err = write(ctx)
		if err == nil {
			return n, attempt == 0, nil
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
