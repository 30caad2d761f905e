package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events/inbox"
)

// Settings of the inbox stage. The prefetch is the demo consumer's.
const (
	inboxMessages = 3000
	inboxPrefetch = 500
	inboxBodySize = 300
	inboxTimeout  = 3 * time.Minute
)

// inboxRun is one consumer's pass over the queue.
type inboxRun struct {
	name        string
	seconds     float64
	perSecond   float64
	cmdsPerMsg  float64 // database commands per message; 0 for the plain consumer
	cmdsByName  string
	transaction bool
}

// inboxConsumer measures a consumer's messages/s with the inbox against a
// plain ack-only consumer, on one queue filled with the same messages
// before each pass: plain; inbox with a no-op handler (its own cost);
// inbox with a handler doing one upsert; inbox again over the ids the
// previous pass recorded (every message a duplicate). Each pass counts the
// database commands it sends.
func (b *bench) inboxConsumer(ctx context.Context) error {
	conn, ch, err := dialChannel(b.cfg.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	queue := uniqueName("bench-inbox")
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	defer func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
	}()

	commands := newCommandCounter()
	client, err := driver.Connect(options.Client().ApplyURI(b.mongoURI).SetMaxPoolSize(10).SetMonitor(commands.monitor()))
	if err != nil {
		return err
	}
	defer client.Disconnect(context.WithoutCancel(ctx)) //nolint:errcheck // harness teardown
	db := client.Database(databaseName)

	business := db.Collection("bench_inbox_business")
	defer dropQuietly(business)
	noop := func(context.Context, amqp.Delivery) error { return nil }
	upsert := func(ctx context.Context, d amqp.Delivery) error {
		_, err := business.UpdateOne(ctx, bson.D{{Key: "_id", Value: d.MessageId}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "seen", Value: true}}}}, options.UpdateOne().SetUpsert(true))
		return err
	}

	var runs []inboxRun
	pass := func(name, idPrefix string, handler inbox.Handler, collection string) error {
		if err := publishN(ctx, ch, queue, idPrefix, inboxMessages); err != nil {
			return err
		}
		commands.reset()
		var r inboxRun
		if handler == nil {
			r, err = plainPass(ctx, conn, queue)
		} else {
			r, err = inboxPass(ctx, conn, queue, client, handler, collection)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.name = name
		if handler != nil {
			r.cmdsPerMsg, r.cmdsByName = commands.per(inboxMessages)
		}
		runs = append(runs, r)
		fmt.Fprintf(b.out, "   %-28s %6.0f msg/s  (%d in %.2fs)  db commands/msg %.2f  %s\n",
			r.name, r.perSecond, inboxMessages, r.seconds, r.cmdsPerMsg, r.cmdsByName)
		return nil
	}
	coll := "bench_inbox"
	defer dropQuietly(db.Collection(coll))
	defer dropQuietly(db.Collection(coll + inbox.AttemptsSuffix))
	if err := pass("plain ack-only", "plain-", nil, ""); err != nil {
		return err
	}
	if err := pass("inbox, no-op handler", "noop-", noop, coll); err != nil {
		return err
	}
	if err := pass("inbox, 1-upsert handler", "upsert-", upsert, coll); err != nil {
		return err
	}
	if err := pass("inbox, all duplicates", "upsert-", upsert, coll); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "   transactions: %v (inbox insert and commit per message with them; lookup and insert without)\n", runs[len(runs)-1].transaction)
	for _, r := range runs {
		inboxFig.set(b.res, append(inboxFig.value(b.res), InboxRun{Name: r.name, PerSecond: round(r.perSecond, 0),
			CommandsPer: round(r.cmdsPerMsg, 2), Commands: r.cmdsByName, Transactions: r.transaction}))
	}
	var sb strings.Builder
	for _, r := range runs {
		fmt.Fprintf(&sb, "%s\t%.0f msg/s\t%.2f db commands/msg\t%s\n", r.name, r.perSecond, r.cmdsPerMsg, r.cmdsByName)
	}
	return os.WriteFile(filepath.Join(b.rawDir, "inbox.txt"), []byte(sb.String()), 0o644)
}

// commandCounter counts the database commands a client sends, in all and
// by the names the inbox uses.
type commandCounter struct {
	all    atomic.Int64
	byName map[string]*atomic.Int64
}

// inboxCommands are the commands the inbox stage reports by name, in
// this order.
var inboxCommands = []string{"find", "insert", "update", "delete", "commitTransaction", "abortTransaction"}

func newCommandCounter() *commandCounter {
	c := &commandCounter{byName: map[string]*atomic.Int64{}}
	for _, n := range inboxCommands {
		c.byName[n] = &atomic.Int64{}
	}
	return c
}

// monitor counts every command started on the client it is set on.
func (c *commandCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.all.Add(1)
		if n, ok := c.byName[e.CommandName]; ok {
			n.Add(1)
		}
	}}
}

func (c *commandCounter) reset() {
	c.all.Store(0)
	for _, n := range c.byName {
		n.Store(0)
	}
}

// per returns the commands per message over n messages, in all and by
// name ("find 1.00 insert 1.00").
func (c *commandCounter) per(n int) (all float64, byName string) {
	var names []string
	for _, name := range inboxCommands {
		if v := c.byName[name].Load(); v > 0 {
			names = append(names, fmt.Sprintf("%s %.2f", name, float64(v)/float64(n)))
		}
	}
	return float64(c.all.Load()) / float64(n), strings.Join(names, " ")
}

// publishN publishes n persistent, confirmed messages with ids
// prefix0..prefix(n-1) to queue, and waits for every confirm.
func publishN(ctx context.Context, ch *amqp.Channel, queue, prefix string, n int) error {
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable confirms: %w", err)
	}
	body := []byte(strings.Repeat("x", inboxBodySize))
	confirms := make([]*amqp.DeferredConfirmation, 0, n)
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: fmt.Sprintf("%s%d", prefix, i), Body: body,
			Headers: amqp.Table{"x-aggregate-type": "order", "x-aggregate-id": fmt.Sprintf("o-%d", i%100)},
		})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish not confirmed: %v", err)
		}
	}
	return nil
}

// consumeQueue consumes queue on a channel of its own, with manual acks
// and the inbox's prefetch, as both passes do.
func consumeQueue(conn *amqp.Connection, queue string) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	if err := ch.Qos(inboxPrefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, nil, err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, err
	}
	return ch, deliveries, nil
}

// plainPass drains the queue acknowledging each message (multiple-acks in
// batches like the inbox's), doing nothing else.
func plainPass(ctx context.Context, conn *amqp.Connection, queue string) (inboxRun, error) {
	ch, deliveries, err := consumeQueue(conn, queue)
	if err != nil {
		return inboxRun{}, err
	}
	defer ch.Close()
	t0 := time.Now()
	timeout := time.After(inboxTimeout)
	for i := 1; i <= inboxMessages; i++ {
		select {
		case d := <-deliveries:
			if i%inbox.AckBatchDefault == 0 || i == inboxMessages {
				if err := d.Ack(true); err != nil {
					return inboxRun{}, err
				}
			}
		case <-timeout:
			return inboxRun{}, fmt.Errorf("drained %d of %d within %s", i-1, inboxMessages, inboxTimeout)
		case <-ctx.Done():
			return inboxRun{}, ctx.Err()
		}
	}
	d := time.Since(t0).Seconds()
	return inboxRun{seconds: d, perSecond: inboxMessages / d}, nil
}

// inboxPass drains the queue through an Inbox on collection.
func inboxPass(ctx context.Context, conn *amqp.Connection, queue string, client *driver.Client, handler inbox.Handler, collection string) (inboxRun, error) {
	in, err := inbox.New(client, handler, inbox.Config{Database: databaseName, Collection: collection})
	if err != nil {
		return inboxRun{}, err
	}
	if err := in.Start(ctx); err != nil {
		return inboxRun{}, err
	}
	defer in.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // harness teardown
	ch, deliveries, err := consumeQueue(conn, queue)
	if err != nil {
		return inboxRun{}, err
	}
	defer ch.Close()
	rctx, cancel := context.WithCancel(ctx)
	done, stopped := make(chan error, 1), make(chan struct{})
	t0 := time.Now()
	go func() { done <- in.Run(rctx, deliveries); close(stopped) }()
	// Not <-done: the loop below may have taken its only value.
	defer func() { cancel(); <-stopped }()
	deadline := t0.Add(inboxTimeout)
	for {
		s := in.Stats()
		if s.Processed+s.Duplicates >= inboxMessages {
			break
		}
		if time.Now().After(deadline) {
			return inboxRun{}, fmt.Errorf("settled %d of %d within %s", s.Processed+s.Duplicates, inboxMessages, inboxTimeout)
		}
		select {
		case err := <-done:
			return inboxRun{}, fmt.Errorf("inbox stopped: %w", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	d := time.Since(t0).Seconds()
	return inboxRun{seconds: d, perSecond: inboxMessages / d, transaction: in.Transactional()}, nil
}

// inboxFig is the consumer's passes, plain and with the inbox.
var inboxFig = figure[[]InboxRun]{"inbox"}

var inboxStage = stage{
	key: "inbox", figures: []anyFigure{inboxFig},
	steps: one("inbox consumer", (*bench).inboxConsumer), rows: inboxRows,
}

func inboxRows(r *Results, add addRow) {
	for _, in := range inboxFig.value(r) {
		result := fmt.Sprintf("%.0f msg/s", in.PerSecond)
		if in.CommandsPer > 0 {
			result += fmt.Sprintf(", %.2f database commands per message (%s)", in.CommandsPer, in.Commands)
		}
		add(fmt.Sprintf("Consumer: %s (transactions: %t)", in.Name, in.Transactions), result, "")
	}
}
