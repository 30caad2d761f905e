package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// The large-documents stage: a few events near MongoDB's 16 MiB document
// limit, relayed by one worker whose batch is bounded in bytes.
const (
	// largeDocs is four batches' worth at the 64 MiB bound. FerretDB
	// decodes every NEW document on each claim's find, about 4 s per
	// claim over 240 MiB here, so forty (ten batches, 150 s) would not fit
	// the bench's budget; the peak memory is that of one batch either way.
	largeDocs     = 16
	largeDocBytes = 15 << 20
	largeBatchEnv = "OUTBOX_BATCH_BYTES=67108864" // 64 MiB
	// largeDocsLimit bounds the wait for them; a worker that cannot relay
	// them is reported, not waited for.
	largeDocsLimit = 2 * time.Minute
)

// largeDocuments relays largeDocs events whose payload holds one 15 MiB string
// with one worker process (OUTBOX_BATCH_BYTES=67108864, 64 MiB, in its environment)
// and reports its peak RSS and how long they took to arrive.
func (b *bench) largeDocuments(ctx context.Context) error {
	coll, _, err := b.preparedCollection(ctx, "large_docs")
	if err != nil {
		return err
	}
	defer dropQuietly(coll)
	blob := strings.Repeat("x", largeDocBytes)
	t0 := time.Now()
	for i := range largeDocs {
		doc, err := events.Draft{
			Type: "bench.large", AggregateType: "blob", AggregateID: fmt.Sprintf("blob-%02d", i),
			Payload: bson.D{{Key: "blob", Value: blob}},
		}.Document(time.Now())
		if err != nil {
			return err
		}
		if _, err := coll.InsertOne(ctx, doc); err != nil {
			return fmt.Errorf("insert large event %d: %w", i, err)
		}
	}
	insert := time.Since(t0)
	exchange := uniqueName("bench-large")
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return err
	}
	defer cons.close() // its queue is exclusive: it goes with the connection

	start := time.Now()
	w, err := b.startWorker(workerOpts{
		id: "bench-large", collection: coll.Name(), exchange: exchange, schedule: b.cfg.DrainSched,
		env: []string{largeBatchEnv},
	})
	if err != nil {
		return err
	}
	defer w.Kill()
	// A worker that fails here must not cost the rest of the run its
	// report: the failure is a result.
	waitErr := cons.waitFor(ctx, largeDocs, largeDocsLimit)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	elapsed := time.Since(start)
	st, err := w.stop(stopTimeout)
	if err != nil {
		return err
	}
	first, deliveries := cons.snapshot()
	r := LargeDocs{
		Events: largeDocs, PayloadMiB: largeDocBytes >> 20, Received: len(first), Deliveries: deliveries,
		WorkerEnv: largeBatchEnv, InsertSeconds: round(insert.Seconds(), 1),
		Seconds: round(elapsed.Seconds(), 1), PeakRSSMB: round(st.peakRSSMB, 1), CPUSeconds: round(st.cpu.Seconds(), 2),
	}
	if waitErr != nil {
		r.Error = waitErr.Error() + " (see raw/bench-large.log)"
	}
	b.res.LargeDocs = &r
	fmt.Fprintf(b.out, "   %d events of %d MiB (inserted in %.1fs): %d received in %.1fs; worker peak RSS %.1f MB, CPU %.1fs%s\n",
		r.Events, r.PayloadMiB, r.InsertSeconds, r.Received, r.Seconds, r.PeakRSSMB, r.CPUSeconds, prefixed("; ", r.Error))
	return nil
}
