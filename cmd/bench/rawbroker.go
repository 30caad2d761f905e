package main

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rawInFlight is how many confirms the raw publisher keeps outstanding.
const rawInFlight = 1000

// rawBodySize is the size of the raw publisher's messages.
const rawBodySize = 300

// The raw broker limit, and the harness's CPU per 1,000 raw publishes:
// the host's floor for a confirmed publish, against which the worker's
// CPU per event is compared.
var (
	rawBrokerFig    = figure[Rate]{"rawBroker"}
	rawBrokerCPUFig = figure[float64]{"rawBrokerCPUMsPer1000"}
)

var rawBrokerStage = stage{
	key: "raw-broker", figures: []anyFigure{rawBrokerFig, rawBrokerCPUFig},
	steps: one("raw broker", (*bench).rawBroker),
	rows: rateRow(rawBrokerFig, "msg", func(*Results) string {
		return fmt.Sprintf("Raw broker limit (own amqp091 publisher, %d B, %s confirms in flight)", rawBodySize, thousands(rawInFlight))
	}),
}

// rawBroker measures the broker's limit with the harness's own publisher
// (not broker.Publisher): confirmed persistent publishes of 300-byte
// messages, 1,000 confirms in flight, to a fresh exchange with one bound
// queue, deleted afterwards.
func (b *bench) rawBroker(ctx context.Context) error {
	conn, ch, err := dialChannel(b.cfg.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	if v, ok := conn.Properties["version"].(string); ok {
		b.res.Machine.RabbitMQ = v
	}
	exchange, queue := uniqueName("bench-raw"), uniqueName("bench-raw-q")
	if err := declareBound(ch, exchange, queue, true); err != nil {
		return err
	}
	defer func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
		}
	}()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable confirms: %w", err)
	}

	body := make([]byte, rawBodySize)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	n := b.cfg.BrokerMsgs
	// The waiter holds one more than the buffer: rawInFlight in all.
	pending := make(chan *amqp.DeferredConfirmation, rawInFlight-1)
	waitErr := make(chan error, 1)
	go func() { // the confirm waiter: oldest first, as the broker confirms in order
		var err error
		for dc := range pending {
			if err != nil {
				continue
			}
			acked, werr := dc.WaitContext(ctx)
			switch {
			case werr != nil:
				err = werr
			case !acked:
				err = errors.New("nacked")
			}
		}
		waitErr <- err
	}()
	start, cpuStart := time.Now(), processCPU()
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "bench", false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			ContentType:  "application/octet-stream",
			MessageId:    fmt.Sprint(i),
			Body:         body,
		})
		if err != nil {
			close(pending)
			return errors.Join(fmt.Errorf("publish %d: %w", i, err), <-waitErr)
		}
		pending <- dc // blocks while rawInFlight confirms are outstanding
	}
	close(pending)
	if err := <-waitErr; err != nil {
		return fmt.Errorf("confirm: %w", err)
	}
	elapsed, cpu := time.Since(start), processCPU()-cpuStart
	rate := rateOf(n, elapsed)
	cpuPer1000 := round(1000*cpu.Seconds()/(float64(n)/1000), 1)
	rawBrokerFig.set(b.res, rate)
	if cpuPer1000 > 0 {
		rawBrokerCPUFig.set(b.res, cpuPer1000)
	}
	fmt.Fprintf(b.out, "   %d confirmed persistent publishes of %d bytes in %.2fs: %.0f/s; harness CPU %.1f ms per 1,000\n",
		n, rawBodySize, elapsed.Seconds(), rate.PerSecond, cpuPer1000)
	return nil
}

// processCPU is the user and system time this process has used. The raw
// publisher's share of it calibrates the worker's CPU figures: it is the
// least CPU a confirmed publish costs with amqp091-go on this host, so the
// ratio carries over between hosts of different speed.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// declareBound declares a durable topic exchange (as the worker does) and
// a queue bound to it with "#".
func declareBound(ch *amqp.Channel, exchange, queue string, durableQueue bool) error {
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", exchange, err)
	}
	if _, err := ch.QueueDeclare(queue, durableQueue, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", queue, err)
	}
	return nil
}

// dialChannel connects to RabbitMQ and opens a channel, closed with the
// connection.
func dialChannel(url string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, fmt.Errorf("dial RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// uniqueName returns prefix plus the time, so that runs never share a
// name on a shared broker.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}
