package main

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
)

// publishStage measures the worker's publisher alone: pre-built batches of
// events.Message, converted from real event documents with
// events.NewMessage as the claimer does, through broker.Publisher with the
// worker's window, each batch waited to its last confirm.
func (b *bench) publishStage(ctx context.Context) error {
	n, size := b.cfg.PublishMsgs, b.cfg.BatchSize
	batches := make([][]events.Message, 0, n/size+1)
	for start := 0; start < n; start += size {
		batch := make([]events.Message, 0, min(size, n-start))
		for i := start; i < min(start+size, n); i++ {
			doc, err := eventDoc(i, time.Now())
			if err != nil {
				return err
			}
			raw, err := bson.Marshal(doc)
			if err != nil {
				return err
			}
			m, err := events.NewMessage(raw, 0)
			if err != nil {
				return err
			}
			batch = append(batch, m)
		}
		batches = append(batches, batch)
	}

	// A queue bound with "#" takes every message: unroutable ones would
	// come back as returns, which is not what this stage measures.
	conn, ch, err := dialChannel(b.cfg.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	exchange, queue := uniqueName("bench-publish"), uniqueName("bench-publish-q")
	if err := declareBound(ch, exchange, queue, true); err != nil {
		return err
	}
	defer func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	}()

	pub, err := broker.New(broker.Config{
		URL:      b.cfg.AMQPURL,
		Exchange: exchange,
		Window:   max(broker.WindowDefault, size), // as cmd/worker sets it
		Logger:   b.logger,
	})
	if err != nil {
		return err
	}
	if err := pub.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = pub.Stop(sctx)
	}()
	if err := pub.Ready(); err != nil {
		return fmt.Errorf("publisher not ready: %w", err)
	}

	start := time.Now()
	for _, batch := range batches {
		for i, err := range pub.Publish(ctx, batch) {
			if err != nil {
				return fmt.Errorf("publish %s: %w", batch[i].ID, err)
			}
		}
	}
	elapsed := time.Since(start)
	r := rateOf(n, elapsed)
	publishFig.set(b.res, r)
	fmt.Fprintf(b.out, "   %d events in batches of %d through broker.Publisher in %.2fs: %.0f/s (body %d bytes)\n",
		n, size, elapsed.Seconds(), r.PerSecond, len(batches[0][0].Body))
	return nil
}

// publishFig is the publish stage's rate.
var publishFig = figure[Rate]{"publishStage"}

const targetPublish = "publish stage vs raw broker"

var publishStageDef = stage{
	key: "publish", figures: []anyFigure{publishFig},
	steps: one("publish stage", (*bench).publishStage), rows: publishRows, targets: publishTargets,
}

func publishRows(r *Results, add addRow) {
	if p := publishFig.value(r); p.Count > 0 {
		add(fmt.Sprintf("Publish stage (broker.Publisher, batches of %d events)", r.Config.BatchSize),
			fmt.Sprintf("%s events/s, %.0f%% of the raw broker limit", thousands(int(p.PerSecond)), 100*ratio(p.PerSecond, rawBrokerFig.value(r).PerSecond)),
			targetPublish)
	}
}

// publishTargets: the publish stage at 60% of the raw broker at least.
func publishTargets(r *Results, add addTarget) {
	raw, p := rawBrokerFig.value(r), publishFig.value(r)
	if raw.PerSecond > 0 && p.PerSecond > 0 {
		ratio := p.PerSecond / raw.PerSecond
		add(targetPublish, ">= 60%",
			fmt.Sprintf("%.0f%% (%.0f of %.0f/s)", 100*ratio, p.PerSecond, raw.PerSecond), ratio >= 0.60)
	}
}
