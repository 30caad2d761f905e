package claim

import (
	"cmp"
	"slices"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/schedule"
	"github.com/outboxrelay/outbox/service"
)

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
	// IdleMaxDefault is the longest gap between two scheduled claims of
	// an outbox whose claims keep finding nothing: what the first event
	// after a long idle waits at most (plus a tick) without a wake-up,
	// for a claim per outbox every 30 s instead of every tick.
	IdleMaxDefault = 30 * time.Second
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
	// BatchSizeMax, BatchBytesMax, MaxAttemptsMax and MaxBodyBytesMax are
	// the largest BatchSize, BatchBytes, MaxAttempts and MaxBodyBytes
	// Validate accepts (16 GiB and 512 MiB the byte bounds).
	BatchSizeMax    = 10000
	BatchBytesMax   = 1 << 34
	MaxAttemptsMax  = 1000
	MaxBodyBytesMax = 512 << 20
	// DelayMin is the least PublishTimeout and RetryMin Validate accepts.
	DelayMin = time.Millisecond
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
	// IdleMax is the longest gap between scheduled claims while claims
	// find nothing: they back off, 1, 2, 4, ... ticks apart up to it,
	// and a claim that finds events, or a Trigger (a wake-up), brings the
	// schedule back (see schedule.Config.IdleSince). A value at or below
	// the schedule's period turns the back-off off. At least 1ms.
	// Defaults to IdleMaxDefault.
	IdleMax time.Duration
	// BatchSize is the most events one claim takes, 1 to 10000. Defaults
	// to BatchSizeDefault.
	BatchSize int
	// BatchBytes bounds the sum of the raw BSON sizes of the documents one
	// claim takes: the claim stops reading once the next document would
	// take the sum past it, except that it always takes one document, so
	// one batch holds at most BatchBytes or one document (up to 16 MiB).
	// The worker's memory for a batch grows with the bound
	// (docs/performance.md, "Peak RSS", has the figures): the raw
	// documents, the message bodies made from them (relaxed Extended
	// JSON, about as large as the BSON for typical payloads, each capped
	// by MaxBodyBytes), the driver's reply buffers (at most 16 MiB of
	// documents per reply, see the mongo package), and the garbage
	// collector's headroom. At most 16 GiB.
	// Defaults to BatchBytesDefault.
	BatchBytes int
	// MaxAttempts is how many claims an event gets before it becomes
	// FAILED, 1 to 1000. Defaults to MaxAttemptsDefault.
	MaxAttempts int
	// MaxBodyBytes bounds a message body; a larger event is FAILED. At
	// most 512 MiB. Defaults to MaxBodyBytesDefault.
	MaxBodyBytes int
	// PublishTimeout bounds the wait for a batch's confirms; events still
	// unconfirmed then go back to NEW. At least 1ms. Defaults to
	// PublishTimeoutDefault.
	PublishTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between retries of a failed
	// publish: 1ms <= RetryMin <= RetryMax. Default to RetryMinDefault and
	// RetryMaxDefault.
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
	// Format is how messages carry their events (OUTBOX_MESSAGE_FORMAT):
	// Name events.FormatPlain, or a CloudEvents format with its Source (a
	// URI-reference) and, in binary mode, the Prefix of the attribute
	// headers. Defaults to events.FormatPlain.
	Format events.Format
	// Owner, when set, says which partitions this worker may claim in
	// (ownership.Manager). Without it the worker claims in all, which is
	// right only for a single worker. Defaults to nil.
	Owner Owner
	// RoundTrip returns the database's round trip as last measured (the
	// worker passes mongo.Clock.RoundTrip), or 0 when none is known.
	// Before the claimer has timed a read and a renewal of its own, it
	// estimates them from it (Claimer.readTimes). Optional.
	RoundTrip func() time.Duration
	// TraceParent is what a message's publish span is to its event's
	// stored trace context (the producer's, the message's creation
	// context) when tracing is on (Archetype.Tracer): TraceParentLink
	// links to it from the relay's own context (a new trace), as the
	// messaging conventions have it; TraceParentChild makes the span its
	// child too, in the producer's trace. The span links to it either
	// way. Defaults to TraceParentLink.
	TraceParent string
	// TraceMessage is the trace context a message carries when tracing
	// is on: TraceMessageProducer keeps the producer's stored one, which
	// the conventions say not to modify (the publish span is then of kind
	// CLIENT); TraceMessagePublish puts the publish span's in its place
	// (kind PRODUCER). A message without a stored context carries the
	// publish span's either way. Defaults to TraceMessageProducer.
	TraceMessage string
	// Archetype is the logger, the metrics, the tracer provider (the
	// relay's spans: see trace.go) and the clocks: leases and
	// retry times read Now; a batch's publish deadline is measured on
	// Local (see Claimer.publishDeadline).
	service.Archetype
}

func (c *Config) setDefaults() {
	c.Schedule = cmp.Or(c.Schedule, ScheduleDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.BatchBytes = cmp.Or(c.BatchBytes, BatchBytesDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, MaxBodyBytesDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	c.RetryMin = cmp.Or(c.RetryMin, RetryMinDefault)
	c.RetryMax = cmp.Or(c.RetryMax, RetryMaxDefault)
	c.StaleAfter = cmp.Or(c.StaleAfter, StaleAfterDefault)
	c.IdleMax = cmp.Or(c.IdleMax, IdleMaxDefault)
	c.Ordering = cmp.Or(c.Ordering, OrderingAggregate)
	c.AfterFailed = cmp.Or(c.AfterFailed, AfterFailedWait)
	c.Format.Name = cmp.Or(c.Format.Name, events.FormatPlain)
	c.Archetype = c.Archetype.WithDefaults()
}

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	return rule.First("claim",
		rule.Required("WorkerID", c.WorkerID != ""),
		rule.Between("BatchSize", c.BatchSize, 1, BatchSizeMax),
		rule.Between("BatchBytes", c.BatchBytes, 1, BatchBytesMax),
		rule.Between("MaxAttempts", c.MaxAttempts, 1, MaxAttemptsMax),
		rule.Between("MaxBodyBytes", c.MaxBodyBytes, 1, MaxBodyBytesMax),
		rule.AtLeast("PublishTimeout", c.PublishTimeout, DelayMin),
		rule.AtLeast("RetryMin", c.RetryMin, DelayMin),
		rule.AtLeast("IdleMax", c.IdleMax, DelayMin),
		rule.AtLeastField("RetryMax", c.RetryMax, "RetryMin", c.RetryMin),
		rule.AboveField("StaleAfter", c.StaleAfter, "PublishTimeout", c.PublishTimeout),
		rule.OneOf("Ordering", c.Ordering, OrderingAggregate, OrderingNone),
		rule.OneOf("AfterFailed", c.AfterFailed, AfterFailedWait, AfterFailedContinue),
		rule.OneOf("Format.Name", c.Format.Name,
			events.FormatPlain, events.FormatCloudEventsBinary, events.FormatCloudEventsStructured),
		rule.Check("Format.Source", c.Format.Name == events.FormatPlain || events.CheckCloudEventsSource(c.Format.Source) == nil,
			c.Format.Source, "a non-empty URI-reference (RFC 3986) in a CloudEvents format"),
		rule.Check("TraceParent", c.TraceParent == "" || c.TraceParent == TraceParentLink || c.TraceParent == TraceParentChild,
			c.TraceParent, TraceParentLink+" or "+TraceParentChild),
		rule.Check("TraceMessage", c.TraceMessage == "" || c.TraceMessage == TraceMessageProducer || c.TraceMessage == TraceMessagePublish,
			c.TraceMessage, TraceMessageProducer+" or "+TraceMessagePublish),
		rule.Check("Format.Prefix", slices.Contains([]string{"", events.PrefixAMQP, events.PrefixAMQPColon, events.PrefixKnative}, c.Format.Prefix),
			c.Format.Prefix, "empty, "+events.PrefixAMQP+", "+events.PrefixAMQPColon+" or "+events.PrefixKnative),
		schedule.Rule("Schedule", c.Schedule),
	)
}
