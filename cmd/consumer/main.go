// Command consumer is the demo consumer of `make dev` and docker-compose. It
// declares a durable queue bound with binding key "#" to the worker's topic
// exchange (declared here too, durable, as the worker declares it),
// consumes every event, and logs every few seconds how many messages arrived
// and how many of them were duplicates by message_id: the figure an
// at-least-once relay keeps rare and a real consumer deduplicates on.
//
// It remembers every message_id it has seen while it runs (about 100 bytes
// each), which is fine for a demo and not how a real consumer should dedupe.
// It stops on SIGINT or SIGTERM and logs its totals.
//
// Every flag may also be set by its environment variable; a flag wins.
//
//	--amqp-url      OUTBOX_AMQP_URL        default amqp://guest:guest@localhost:5672/
//	--exchange      OUTBOX_AMQP_EXCHANGE   default events
//	--queue         CONSUMER_QUEUE         default outbox-demo
//	--queue-expires CONSUMER_QUEUE_EXPIRES delete the queue after this long unused (x-expires); 0 (default) never
//	--report-every  CONSUMER_REPORT_EVERY  default 5s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/broker"
)

const (
	// bindingKey matches every routing key, i.e. every event type.
	bindingKey = "#"
	// prefetch bounds the unacknowledged messages in flight to this consumer.
	prefetch = 500
	// dialTimeout bounds one connection attempt.
	dialTimeout = 5 * time.Second
	// reconnectMax caps the wait between reconnects.
	reconnectMax = 30 * time.Second
)

type config struct {
	AMQPURL      string
	Exchange     string
	Queue        string
	QueueExpires time.Duration
	ReportEvery  time.Duration
}

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := parseConfig(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		logger.Error("invalid configuration", "error", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	run(ctx, cfg, logger)
}

// parseConfig reads flags, then the environment for each flag not given.
func parseConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.StringVar(&c.AMQPURL, "amqp-url", "amqp://guest:guest@localhost:5672/", "RabbitMQ URL (env OUTBOX_AMQP_URL)")
	fs.StringVar(&c.Exchange, "exchange", broker.ExchangeDefault, "topic exchange the worker publishes to (env OUTBOX_AMQP_EXCHANGE)")
	fs.StringVar(&c.Queue, "queue", "outbox-demo", "durable queue to declare, bind with \"#\" and consume (env CONSUMER_QUEUE)")
	fs.DurationVar(&c.QueueExpires, "queue-expires", 0, "let RabbitMQ delete the queue after this long without consumers (x-expires); 0 keeps it (env CONSUMER_QUEUE_EXPIRES)")
	fs.DurationVar(&c.ReportEvery, "report-every", 5*time.Second, "how often to log the counts (env CONSUMER_REPORT_EVERY)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, b := range []struct{ flag, env string }{
		{"amqp-url", "OUTBOX_AMQP_URL"},
		{"exchange", "OUTBOX_AMQP_EXCHANGE"},
		{"queue", "CONSUMER_QUEUE"},
		{"queue-expires", "CONSUMER_QUEUE_EXPIRES"},
		{"report-every", "CONSUMER_REPORT_EVERY"},
	} {
		v := strings.TrimSpace(getenv(b.env))
		if given[b.flag] || v == "" {
			continue
		}
		if err := fs.Set(b.flag, v); err != nil {
			return config{}, fmt.Errorf("%s %q: %w", b.env, broker.Redact(v), err)
		}
	}
	switch {
	case !strings.HasPrefix(c.AMQPURL, "amqp://") && !strings.HasPrefix(c.AMQPURL, "amqps://"):
		return config{}, fmt.Errorf("amqp URL (OUTBOX_AMQP_URL) %q: want amqp://user:password@host:port/vhost", broker.Redact(c.AMQPURL))
	case c.Exchange == "":
		return config{}, errors.New("exchange (OUTBOX_AMQP_EXCHANGE) is empty")
	case c.Queue == "":
		return config{}, errors.New("queue (CONSUMER_QUEUE) is empty")
	case c.QueueExpires < 0 || (c.QueueExpires > 0 && c.QueueExpires < time.Millisecond):
		return config{}, fmt.Errorf("queue expiry (CONSUMER_QUEUE_EXPIRES) %s: want 0 or at least 1ms", c.QueueExpires)
	case c.ReportEvery < 100*time.Millisecond:
		return config{}, fmt.Errorf("report interval (CONSUMER_REPORT_EVERY) %s: want at least 100ms", c.ReportEvery)
	}
	return c, nil
}

// tally counts deliveries and duplicates by message_id.
type tally struct {
	seen map[string]struct{}
	// Totals since start.
	received, duplicates, redelivered, noID int
	// Since the last report.
	lastReceived, lastDuplicates int
}

func (t *tally) add(d amqp.Delivery) {
	t.received++
	if d.Redelivered {
		t.redelivered++ // RabbitMQ's own redelivery, not the relay's duplicate
	}
	if d.MessageId == "" {
		t.noID++
		return
	}
	if _, dup := t.seen[d.MessageId]; dup {
		t.duplicates++
		return
	}
	t.seen[d.MessageId] = struct{}{}
}

func (t *tally) report(logger *slog.Logger, msg string) {
	logger.Info(msg,
		"received", t.received-t.lastReceived,
		"duplicates", t.duplicates-t.lastDuplicates,
		"received_total", t.received,
		"unique_total", len(t.seen),
		"duplicates_total", t.duplicates,
		"redelivered_total", t.redelivered,
		"without_message_id_total", t.noID,
	)
	t.lastReceived, t.lastDuplicates = t.received, t.duplicates
}

// run consumes until ctx ends, reconnecting with backoff whenever the
// connection drops, and logs the totals when it stops.
func run(ctx context.Context, cfg config, logger *slog.Logger) {
	logger = logger.With("exchange", cfg.Exchange, "queue", cfg.Queue)
	logger.Info("consumer starting", "amqp_url", broker.Redact(cfg.AMQPURL), "binding_key", bindingKey)
	t := &tally{seen: map[string]struct{}{}}
	ticker := time.NewTicker(cfg.ReportEvery)
	defer ticker.Stop()
	wait := 500 * time.Millisecond
	for {
		connected, err := consume(ctx, cfg, logger, t, ticker.C)
		if ctx.Err() != nil {
			t.report(logger, "consumer stopped")
			return
		}
		if connected {
			wait = 500 * time.Millisecond
		}
		logger.Warn("rabbitmq unavailable; reconnecting", "error", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
			t.report(logger, "consumer stopped")
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, reconnectMax)
	}
}

// consume runs one connection: it declares the exchange, the queue and the
// binding, then counts and acknowledges deliveries until ctx ends or the
// connection drops. connected reports whether it got as far as consuming.
func consume(ctx context.Context, cfg config, logger *slog.Logger, t *tally, tick <-chan time.Time) (connected bool, err error) {
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{
		Dial:       amqp.DefaultDial(dialTimeout),
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": "outbox-demo-consumer"},
	})
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", broker.Redact(cfg.AMQPURL), err)
	}
	// Closing the connection hands unacknowledged deliveries back to the
	// queue; every counted delivery has been acknowledged by then.
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	// The same declaration as the worker's: a mismatch would close the channel.
	if err := ch.ExchangeDeclare(cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return false, fmt.Errorf("declare exchange %q: %w", cfg.Exchange, err)
	}
	var args amqp.Table
	if cfg.QueueExpires > 0 {
		args = amqp.Table{"x-expires": cfg.QueueExpires.Milliseconds()}
	}
	if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, args); err != nil {
		return false, fmt.Errorf("declare queue %q: %w", cfg.Queue, err)
	}
	if err := ch.QueueBind(cfg.Queue, bindingKey, cfg.Exchange, false, nil); err != nil {
		return false, fmt.Errorf("bind queue %q to %q: %w", cfg.Queue, cfg.Exchange, err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return false, fmt.Errorf("set prefetch: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume %q: %w", cfg.Queue, err)
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	logger.Info("consuming")
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-tick:
			t.report(logger, "messages received")
		case d, ok := <-deliveries:
			if !ok {
				return true, closeReason(ctx, connClosed, chClosed)
			}
			t.add(d)
			if err := d.Ack(false); err != nil {
				return true, fmt.Errorf("ack: %w", err)
			}
		}
	}
}

// closeReason says why the deliveries stopped: the broker's error on the
// connection or the channel when it gave one.
func closeReason(ctx context.Context, connClosed, chClosed <-chan *amqp.Error) error {
	select {
	case e := <-connClosed:
		if e != nil {
			return fmt.Errorf("connection closed: %w", e)
		}
	case e := <-chClosed:
		if e != nil {
			return fmt.Errorf("channel closed: %w", e)
		}
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	return errors.New("deliveries stopped")
}
