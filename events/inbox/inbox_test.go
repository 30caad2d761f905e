package inbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events/internal/servertest"
)

const waitFor = 20 * time.Second

// rig is one test's database, queue (with a dead-letter queue) and inbox.
type rig struct {
	t        *testing.T
	db       *mongo.Database
	in       *Inbox
	conn     *amqp.Connection
	ch       *amqp.Channel
	queue    string
	dlq      string
	business *mongo.Collection
	logs     *servertest.LogBuffer
}

// setup declares a queue that dead-letters to its own DLQ through the
// default exchange, and starts an inbox with handler in a fresh database.
func setup(t *testing.T, handler Handler, cfg Config) *rig {
	t.Helper()
	r := &rig{t: t, db: servertest.Database(t), logs: &servertest.LogBuffer{}}
	r.business = r.db.Collection("business")
	cfg.Database = r.db.Name()
	cfg.Logger = slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.RetryPause == 0 {
		cfg.RetryPause = time.Millisecond
	}
	in, err := New(r.db.Client(), handler, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	servertest.Start(t, in)
	r.in = in

	r.conn = servertest.Dial(t, servertest.AMQPURL(t))
	r.queue, r.dlq = servertest.UniqueName(t, "inbox_q_"), servertest.UniqueName(t, "inbox_dlq_")
	t.Cleanup(func() {
		if ch, err := r.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(r.queue, false, false, false)
			_, _ = ch.QueueDelete(r.dlq, false, false, false)
		}
	})
	r.ch = r.channel()
	if _, err := r.ch.QueueDeclare(r.dlq, false, false, false, false, nil); err != nil {
		t.Fatalf("declare %s: %v", r.dlq, err)
	}
	if _, err := r.ch.QueueDeclare(r.queue, false, false, false, false, amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": r.dlq,
	}); err != nil {
		t.Fatalf("declare %s: %v", r.queue, err)
	}
	return r
}

func (r *rig) channel() *amqp.Channel {
	r.t.Helper()
	ch, err := r.conn.Channel()
	if err != nil {
		r.t.Fatalf("open channel: %v", err)
	}
	return ch
}

// publish sends a message as the relay does: message_id and the
// aggregate headers.
func (r *rig) publish(id, aggregateID string) {
	r.t.Helper()
	r.publishWith(id, amqp.Table{"x-aggregate-type": "order", "x-aggregate-id": aggregateID})
}

// publishWith sends a message with message_id id and the given headers.
func (r *rig) publishWith(id string, headers amqp.Table) {
	r.t.Helper()
	err := r.ch.PublishWithContext(r.t.Context(), "", r.queue, false, false, amqp.Publishing{
		MessageId: id, Type: "order.updated", ContentType: "application/json",
		Headers: headers,
		Body:    []byte(`{"id":"` + id + `"}`),
	})
	if err != nil {
		r.t.Fatalf("publish %s: %v", id, err)
	}
}

// consume starts a consumer on a channel of its own with the given prefetch.
func (r *rig) consume(ch *amqp.Channel, prefetch int) <-chan amqp.Delivery {
	r.t.Helper()
	if err := ch.Qos(prefetch, 0, false); err != nil {
		r.t.Fatalf("qos: %v", err)
	}
	d, err := ch.Consume(r.queue, "", false, false, false, false, nil)
	if err != nil {
		r.t.Fatalf("consume %s: %v", r.queue, err)
	}
	return d
}

// receive takes one message from the queue on ch, unsettled: the test
// processes it by hand, then closes ch.
func (r *rig) receive(ch *amqp.Channel) amqp.Delivery {
	r.t.Helper()
	select {
	case d := <-r.consume(ch, 1):
		return d
	case <-time.After(waitFor):
		r.t.Fatal("no delivery")
		return amqp.Delivery{}
	}
}

// run runs the inbox on a new consumer until the test ends.
func (r *rig) run() {
	r.t.Helper()
	deliveries := r.consume(r.channel(), 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.in.Run(ctx, deliveries) }()
	r.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			r.t.Errorf("Run: %v", err)
		}
	})
}

// eventually waits until cond holds, failing the test with what and the
// inbox's logs.
func (r *rig) eventually(what string, cond func() bool) {
	r.t.Helper()
	servertest.Eventually(r.t, waitFor, func() (bool, string) {
		return cond(), what + "\nlogs:\n" + r.logs.String()
	})
}

// queued returns how many messages wait in queue, unacknowledged ones not
// counted.
func (r *rig) queued(queue string) int {
	r.t.Helper()
	q, err := r.channel().QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		r.t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages
}

func (r *rig) countIn(coll *mongo.Collection, id string) int64 {
	r.t.Helper()
	n, err := coll.CountDocuments(r.t.Context(), bson.D{{Key: "_id", Value: id}})
	if err != nil {
		r.t.Fatalf("count %s in %s: %v", id, coll.Name(), err)
	}
	return n
}

// recorder is a handler that notes the ids it ran for, in order, and
// writes one business document per run.
type recorder struct {
	mu   sync.Mutex
	ids  []string
	coll *mongo.Collection
	fail func(id string) error
}

func (h *recorder) handle(ctx context.Context, d amqp.Delivery) error {
	h.mu.Lock()
	h.ids = append(h.ids, d.MessageId)
	coll, fail := h.coll, h.fail
	h.mu.Unlock()
	if coll != nil {
		if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: d.MessageId}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "runs", Value: 1}}}}, upsert()); err != nil {
			return err
		}
	}
	if fail != nil {
		return fail(d.MessageId)
	}
	return nil
}

func (h *recorder) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ids...)
}

// TestDuplicateAfterLaterEventSkipped: the relay's duplicate of an earlier
// event, arriving after a later event of the same aggregate, is acked
// without running the handler.
func TestDuplicateAfterLaterEventSkipped(t *testing.T) {
	t.Parallel()
	h := &recorder{}
	r := setup(t, h.handle, Config{})
	h.coll = r.business
	r.publish("o-1/v1", "o-1")
	r.publish("o-1/v2", "o-1")
	r.publish("o-1/v1", "o-1") // a killed replica's batch, delivered again
	r.run()
	r.eventually("2 processed and 1 duplicate", func() bool {
		s := r.in.Stats()
		return s.Processed == 2 && s.Duplicates == 1
	})
	if got := strings.Join(h.seen(), ","); got != "o-1/v1,o-1/v2" {
		t.Errorf("handler ran for %s, want o-1/v1,o-1/v2 once each, in order", got)
	}
	for _, id := range []string{"o-1/v1", "o-1/v2"} {
		if n := r.countIn(r.in.records, id); n != 1 {
			t.Errorf("inbox records for %s = %d, want 1", id, n)
		}
	}
	r.eventually("queue drained (all acked)", func() bool { return r.queued(r.queue) == 0 })
}

// TestKilledBetweenCommitAndAck: the record is committed, then the channel
// closes before the ack; the redelivery is skipped.
func TestKilledBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	h := &recorder{}
	r := setup(t, h.handle, Config{})
	r.publish("m-1", "o-1")

	first := r.channel()
	d := r.receive(first)
	out, err := r.in.process(t.Context(), d) // commits; does not settle
	if err != nil || out != outcomeAck {
		t.Fatalf("process = %v, %v; want ack, nil", out, err)
	}
	if err := first.Close(); err != nil { // the consumer dies before its ack
		t.Fatal(err)
	}

	r.run()
	r.eventually("the redelivery is skipped as a duplicate", func() bool { return r.in.Stats().Duplicates == 1 })
	if got := h.seen(); len(got) != 1 {
		t.Errorf("handler ran %d times (%v), want once", len(got), got)
	}
	r.eventually("queue drained", func() bool { return r.queued(r.queue) == 0 })
}

// TestFailingHandlerLeavesNoRecord: a failed attempt records nothing, is
// requeued and counted, and the next attempt's success is recorded.
func TestFailingHandlerLeavesNoRecord(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	failures := 1
	h := &recorder{fail: func(string) error {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return errors.New("downstream unavailable")
		}
		return nil
	}}
	r := setup(t, h.handle, Config{MaxAttempts: 3})

	// One attempt through Handle, to look between the failure and the retry.
	r.publish("m-fail", "o-1")
	ch := r.channel()
	d := r.receive(ch)
	if err := r.in.Handle(t.Context(), d); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if n := r.countIn(r.in.records, "m-fail"); n != 0 {
		t.Errorf("after a failed attempt: %d inbox records, want 0", n)
	}
	if n := r.attemptsOf("m-fail"); n != 1 {
		t.Errorf("after a failed attempt: attempts = %d, want 1", n)
	}
	if got := r.in.Stats().HandlerErrors; got != 1 {
		t.Errorf("handler errors = %v, want 1", got)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}

	r.run()
	r.eventually("the retry processed", func() bool { return r.in.Stats().Processed == 1 })
	if n := r.countIn(r.in.records, "m-fail"); n != 1 {
		t.Errorf("after the successful retry: %d inbox records, want 1", n)
	}
	r.eventually("attempts forgotten after success", func() bool { return r.attemptsOf("m-fail") == 0 })
}

func (r *rig) attemptsOf(id string) int {
	r.t.Helper()
	var doc struct {
		Attempts int `bson:"attempts"`
	}
	err := r.in.attempts.FindOne(r.t.Context(), bson.D{{Key: "_id", Value: id}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0
	}
	if err != nil {
		r.t.Fatalf("read attempts of %s: %v", id, err)
	}
	return doc.Attempts
}

// TestPoisonDeadLettered: a message whose handler always panics is tried
// MaxAttempts times, then rejected onto the dead-letter queue; the next
// message is processed.
func TestPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	h := &recorder{fail: func(id string) error {
		if id == "poison" {
			panic("cannot parse order")
		}
		return nil
	}}
	spy := &metricsSpy{}
	r := setup(t, h.handle, Config{MaxAttempts: 3, Metrics: spy.metrics()})
	r.publish("poison", "o-1")
	r.publish("fine", "o-2")
	r.run()

	var dead amqp.Delivery
	r.eventually("poison on the dead-letter queue", func() bool {
		d, ok, err := r.ch.Get(r.dlq, true)
		if err != nil {
			t.Fatalf("get from %s: %v", r.dlq, err)
		}
		dead = d
		return ok
	})
	if dead.MessageId != "poison" {
		t.Errorf("dead-lettered %q, want poison", dead.MessageId)
	}
	r.eventually("fine processed", func() bool { return r.in.Stats().Processed == 1 })
	runs := 0
	for _, id := range h.seen() {
		if id == "poison" {
			runs++
		}
	}
	if runs != 3 {
		t.Errorf("poison handled %d times, want MaxAttempts = 3", runs)
	}
	if got, want := r.in.Stats(), (Stats{Processed: 1, HandlerErrors: 3, Rejected: 1}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	want := map[string]int{"processed": 1, "handler_error": 3, "rejected " + ReasonMaxAttempts: 1, "handled": 4}
	if diff := spy.diff(want); diff != "" {
		t.Errorf("Metrics calls (-want +got):\n%s", diff)
	}
	if n := r.countIn(r.in.records, "poison"); n != 0 {
		t.Errorf("poison has %d inbox records, want 0", n)
	}
	if n := r.attemptsOf("poison"); n != 0 {
		t.Errorf("poison's attempts document left with %d, want it deleted on rejection", n)
	}
	logs := r.logs.String()
	if !strings.Contains(logs, `"message_id":"poison"`) || !strings.Contains(logs, "cannot parse order") || !strings.Contains(logs, `"reason":"max_attempts"`) {
		t.Errorf("rejection not logged with message_id, the panic and the reason:\n%s", logs)
	}
}

// TestNoMessageIDRejected: nothing to deduplicate on, so no handler run.
func TestNoMessageIDRejected(t *testing.T) {
	t.Parallel()
	h := &recorder{}
	r := setup(t, h.handle, Config{})
	if err := r.ch.PublishWithContext(t.Context(), "", r.queue, false, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	r.run()
	r.eventually("dead-lettered", func() bool { return r.queued(r.dlq) == 1 })
	if got := h.seen(); len(got) != 0 {
		t.Errorf("handler ran for %v, want never", got)
	}
}

// TestWithoutTransactions: on FerretDB the inbox says, once, that the
// handler must be idempotent, and expires records with its cleanup job.
func TestWithoutTransactions(t *testing.T) {
	t.Parallel()
	r := setup(t, (&recorder{}).handle, Config{})
	if !servertest.IsFerretDB(t, r.db.Client()) {
		t.Skip("runs on FerretDB; a real MongoDB is the container suite's")
	}
	if r.in.Transactional() || r.in.ExpiresByTTL() {
		t.Errorf("Transactional, ExpiresByTTL = %v, %v on FerretDB; want false, false", r.in.Transactional(), r.in.ExpiresByTTL())
	}
	if err := r.in.Start(t.Context()); err != nil { // idempotent: no second warning
		t.Fatal(err)
	}
	if n := strings.Count(r.logs.String(), "must be idempotent"); n != 1 {
		t.Errorf("the weaker guarantee was logged %d times, want once:\n%s", n, r.logs.String())
	}

	now := time.Now().UTC()
	old, fresh := now.Add(-RetentionDefault-time.Minute), now.Add(-time.Minute)
	if _, err := r.in.records.InsertMany(t.Context(), []any{
		record{ID: "old", ProcessedAt: old}, record{ID: "fresh", ProcessedAt: fresh},
	}); err != nil {
		t.Fatal(err)
	}
	n, err := r.in.cleanupOnce(t.Context())
	if err != nil || n != 1 {
		t.Fatalf("cleanupOnce = %d, %v; want 1 deleted", n, err)
	}
	if r.countIn(r.in.records, "old") != 0 || r.countIn(r.in.records, "fresh") != 1 {
		t.Error("cleanup must delete the expired record and keep the fresh one")
	}
}

func TestDeliveryCount(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		h      amqp.Table
		n      int
		wantOK bool
	}{
		{nil, 0, false},
		{amqp.Table{"x-delivery-count": int64(2)}, 2, true},
		{amqp.Table{"x-delivery-count": int32(1)}, 1, true},
		{amqp.Table{"x-delivery-count": "2"}, 0, false},
		{amqp.Table{"x-delivery-count": int64(-1)}, -1, false},
	} {
		n, ok := deliveryCount(tt.h)
		if n != tt.n || ok != tt.wantOK {
			t.Errorf("deliveryCount(%v) = %d, %v; want %d, %v", tt.h, n, ok, tt.n, tt.wantOK)
		}
	}
}

func upsert() options.Lister[options.UpdateOneOptions] { return options.UpdateOne().SetUpsert(true) }

// TestQuorumQueueCountsDeliveries: on a quorum queue the attempt comes from
// x-delivery-count, and the message is dead-lettered after MaxAttempts.
// The publisher's own x-delivery-count (a forged 99) makes no difference:
// the quorum queue writes its own.
func TestQuorumQueueCountsDeliveries(t *testing.T) {
	t.Parallel()
	h := &recorder{fail: func(string) error { return errors.New("always") }}
	r := setup(t, h.handle, Config{MaxAttempts: 3, QueueType: QueueQuorum})
	r.useQuorumQueue()
	r.publishWith("qq-poison", amqp.Table{HeaderDeliveryCount: int64(99)})
	r.run()
	r.eventually("dead-lettered", func() bool { return r.queued(r.dlq) == 1 })
	if n := len(h.seen()); n != 3 {
		t.Errorf("handler ran %d times, want MaxAttempts = 3", n)
	}
	if !strings.Contains(r.logs.String(), `"attempts_from":"x-delivery-count"`) {
		t.Errorf("rejection not counted from x-delivery-count:\n%s", r.logs.String())
	}
}

// useQuorumQueue replaces setup's classic queue with a quorum queue that
// dead-letters to the same DLQ.
func (r *rig) useQuorumQueue() {
	r.t.Helper()
	if _, err := r.ch.QueueDelete(r.queue, false, false, false); err != nil { // setup's classic queue
		r.t.Fatal(err)
	}
	r.queue = servertest.UniqueName(r.t, "inbox_qq_") // deleted by setup's cleanup
	if _, err := r.ch.QueueDeclare(r.queue, true, false, false, false, amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": r.dlq,
	}); err != nil {
		r.t.Fatalf("declare quorum queue: %v", err)
	}
}

// TestForgedDeliveryCount: an x-delivery-count the publisher wrote does
// not count attempts. On a classic queue the inbox counts them itself, so a
// forged 99 does not dead-letter a message at its first failure and a
// forged 0 does not let a poison message loop; on a quorum queue the
// broker's count wins.
func TestForgedDeliveryCount(t *testing.T) {
	t.Parallel()
	const maxAttempts = 3
	for _, tt := range []struct {
		name      string
		queueType string
		forged    any
		failures  int // the handler fails this many times, then succeeds; -1: always
		wantRuns  int
		wantDead  bool
	}{
		{name: "classic 99 fails once", queueType: QueueClassic, forged: int64(99), failures: 1, wantRuns: 2},
		{name: "classic 0 always fails", queueType: QueueClassic, forged: int64(0), failures: -1, wantRuns: maxAttempts, wantDead: true},
		{name: "classic int32 1 always fails", queueType: QueueClassic, forged: int32(1), failures: -1, wantRuns: maxAttempts, wantDead: true},
		{name: "quorum 99 fails once", queueType: QueueQuorum, forged: int64(99), failures: 1, wantRuns: 2},
		{name: "quorum 0 always fails", queueType: QueueQuorum, forged: int64(0), failures: -1, wantRuns: maxAttempts, wantDead: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			runs := 0
			h := &recorder{fail: func(string) error {
				mu.Lock()
				defer mu.Unlock()
				runs++
				if tt.failures < 0 || runs <= tt.failures {
					return errors.New("handler failed")
				}
				return nil
			}}
			r := setup(t, h.handle, Config{MaxAttempts: maxAttempts, QueueType: tt.queueType})
			if tt.queueType == QueueQuorum {
				r.useQuorumQueue()
			}
			r.publishWith("forged", amqp.Table{HeaderDeliveryCount: tt.forged})
			r.run()
			if tt.wantDead {
				r.eventually("dead-lettered", func() bool { return r.queued(r.dlq) == 1 })
			} else {
				r.eventually("processed", func() bool { return r.in.Stats().Processed == 1 })
			}
			if n := len(h.seen()); n != tt.wantRuns {
				t.Errorf("handler ran %d times, want %d\nlogs:\n%s", n, tt.wantRuns, r.logs.String())
			}
			if got := r.in.Stats().Rejected; got != map[bool]int64{true: 1}[tt.wantDead] {
				t.Errorf("rejected %d, want dead-lettered = %t", got, tt.wantDead)
			}
			if tt.queueType == QueueClassic && strings.Contains(r.logs.String(), `"attempts_from":"x-delivery-count"`) {
				t.Errorf("a classic queue's header was read as the count:\n%s", r.logs.String())
			}
		})
	}
}
