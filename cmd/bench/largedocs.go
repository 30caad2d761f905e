package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// The large-documents stage: a few events near MongoDB's 16 MiB document
// limit, relayed by one worker under the shipped Deployment's memory
// limit, its batch bound derived from that limit (OUTBOX_BATCH_BYTES left
// at auto).
const (
	// largeDocs is four batches' worth at the 64 MiB bound. FerretDB
	// decodes every NEW document on each claim's find, about 4 s per
	// claim over 240 MiB here, so forty (ten batches, 150 s) would not fit
	// the bench's budget; the peak memory is that of one batch either way.
	largeDocs     = 16
	largeDocBytes = 15 << 20
	// largeMemLimitMiB is the worker container's memory limit in
	// deploy/kubernetes/deployment.yaml; the worker reads it from
	// GOMEMLIMIT as it would from the container's cgroup.
	largeMemLimitMiB = 256
	largeMemLimitEnv = "GOMEMLIMIT=256MiB"
	// largeDocsLimit bounds the wait for them; a worker that cannot relay
	// them is reported, not waited for.
	largeDocsLimit = 2 * time.Minute
)

// largeDocuments relays largeDocs events whose payload holds one 15 MiB
// string with one worker process of each build (-worker, then -baseline),
// each on a fresh collection, and reports the worker's peak RSS against
// the memory limit it ran under, the batch bound it derived from that
// limit and how long the events took to arrive.
func (b *bench) largeDocuments(ctx context.Context) error {
	var runs []LargeDocs
	for _, bin := range b.workerBinaries() {
		r, err := b.largeDocsRun(ctx, bin)
		if err != nil {
			return err
		}
		fmt.Fprintf(b.out, "   %s: %d events of %d MiB (inserted in %.1fs): %d received in %.1fs; worker peak RSS %.1f MiB of the %d MiB limit (%s), CPU %.1fs%s\n",
			r.Build, r.Events, r.PayloadMiB, r.InsertSeconds, r.Received, r.Seconds, r.PeakRSSMB, r.MemoryLimitMiB, r.batchBytes(), r.CPUSeconds, prefixed("; ", r.Error))
		runs = append(runs, r)
	}
	// This build's figures stay at the top level of bench.json's
	// largeDocuments, where cmd/worker's memory test reads them.
	ld := runs[0]
	if len(runs) > 1 {
		ld.Baseline = &runs[1]
	}
	largeFig.set(b.res, ld)
	return nil
}

// largeDocsRun is one worker process of bin relaying the stage's events.
func (b *bench) largeDocsRun(ctx context.Context, bin WorkerBuild) (LargeDocs, error) {
	label := strings.ReplaceAll(bin.Build, " ", "-")
	coll, _, err := b.preparedCollection(ctx, "large_docs_"+strings.ReplaceAll(label, "-", "_"))
	if err != nil {
		return LargeDocs{}, err
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
			return LargeDocs{}, err
		}
		if _, err := coll.InsertOne(ctx, doc); err != nil {
			return LargeDocs{}, fmt.Errorf("insert large event %d: %w", i, err)
		}
	}
	insert := time.Since(t0)
	exchange := uniqueName("bench-large-" + label)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return LargeDocs{}, err
	}
	defer cons.close() // its queue is exclusive: it goes with the connection

	// The first process keeps the log name of earlier runs.
	id := "bench-large"
	if !bin.isCurrent() {
		id += "-" + label
	}
	start := time.Now()
	w, err := b.startWorker(workerOpts{
		id: id, collection: coll.Name(), exchange: exchange, schedule: b.cfg.DrainSched, bin: bin.Binary,
		// Info level for the worker's "memory" line, which says what
		// it derived from the limit.
		env: []string{largeMemLimitEnv, "OUTBOX_LOG_LEVEL=info"},
	})
	if err != nil {
		return LargeDocs{}, err
	}
	defer w.Kill()
	// A worker that fails here must not cost the rest of the run its
	// report: the failure is a result.
	waitErr := cons.waitFor(ctx, largeDocs, largeDocsLimit)
	if ctx.Err() != nil {
		return LargeDocs{}, ctx.Err()
	}
	elapsed := time.Since(start)
	st, err := w.stop(stopTimeout)
	if err != nil {
		return LargeDocs{}, err
	}
	first, deliveries := cons.snapshot()
	r := LargeDocs{
		Build: bin.Build, Binary: bin.Binary,
		Events: largeDocs, PayloadMiB: largeDocBytes >> 20, Received: len(first), Deliveries: deliveries,
		MemoryLimitEnv: largeMemLimitEnv, MemoryLimitMiB: largeMemLimitMiB, InsertSeconds: round(insert.Seconds(), 1),
		Seconds: round(elapsed.Seconds(), 1), PeakRSSMB: round(st.peakRSSMB, 1), CPUSeconds: round(st.cpu.Seconds(), 2),
	}
	// VmHWM is read in units of 2^20 bytes, the limit's unit.
	r.PeakRSSToLimit = round(st.peakRSSMB/largeMemLimitMiB, 3)
	logPath := filepath.Join(b.rawDir, id+".log")
	r.BatchBytes, r.MemoryLimitSource = loggedMemory(logPath)
	r.WorkerEnv = largeBatchEnv(r.BatchBytes)
	if waitErr != nil {
		r.Error = waitErr.Error() + " (see " + logPath + ")"
	}
	return r, nil
}

// largeBatchEnv is the OUTBOX_BATCH_BYTES the worker ran with, as
// bench.json's largeDocuments.workerEnv records it: the bound it derived,
// or auto where it did not say.
func largeBatchEnv(batchBytes int) string {
	if batchBytes > 0 {
		return "OUTBOX_BATCH_BYTES=" + strconv.Itoa(batchBytes)
	}
	return "OUTBOX_BATCH_BYTES=auto"
}

// memoryLine matches the worker's info line that states its memory limit
// and batch bound (cmd/worker's applyMemoryLimit), in the text format.
var memoryLine = regexp.MustCompile(`msg=memory .*limit_source=(\S*) .*batch_bytes=([0-9]+)`)

// loggedMemory reads the batch bound and the limit's source from the
// worker's memory line in its log; 0 and "" when the worker logged none
// (a build from before OUTBOX_BATCH_BYTES=auto).
func loggedMemory(logPath string) (batchBytes int, source string) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return 0, ""
	}
	m := memoryLine.FindSubmatch(data)
	if m == nil {
		return 0, ""
	}
	n, err := strconv.Atoi(string(m[2]))
	if err != nil {
		return 0, ""
	}
	return n, strings.Trim(string(m[1]), `"`)
}

// batchBytes says what bound the run's worker derived, for the output.
func (r LargeDocs) batchBytes() string {
	if r.BatchBytes == 0 {
		return "OUTBOX_BATCH_BYTES auto; the worker did not log what it derived"
	}
	return fmt.Sprintf("OUTBOX_BATCH_BYTES auto: %s bytes, %.1f MiB, from %s", thousands(r.BatchBytes), float64(r.BatchBytes)/(1<<20), r.MemoryLimitSource)
}

// largeRows adds the large-document rows: this build's run, then the
// baseline's. A run from before the stage had a memory limit keeps the
// row it had.
func largeRows(r *Results, add addRow) {
	ld, ok := largeFig.get(r)
	if !ok {
		return
	}
	if ld.MemoryLimitMiB == 0 {
		add(fmt.Sprintf("Large documents: %d events of %d MiB, 1 worker (%s)", ld.Events, ld.PayloadMiB, ld.WorkerEnv),
			fmt.Sprintf("%d of %d received in %.1f s; worker peak RSS %.1f MB, CPU %.1f s%s", ld.Received, ld.Events, ld.Seconds, ld.PeakRSSMB, ld.CPUSeconds, prefixed("; NOT ALL: ", ld.Error)), "")
		return
	}
	for i, run := range []*LargeDocs{&ld, ld.Baseline} {
		if run == nil {
			continue
		}
		target := ""
		if i == 0 {
			target = targetLargeRSS
		}
		add(fmt.Sprintf("Large documents: %d events of %d MiB, 1 worker under %s, OUTBOX_BATCH_BYTES unset (auto) (%s)", run.Events, run.PayloadMiB, run.MemoryLimitEnv, run.Build),
			fmt.Sprintf("%d of %d received in %.1f s; worker peak RSS %.1f MiB, %.0f%% of the %d MiB limit; %s; CPU %.1f s%s",
				run.Received, run.Events, run.Seconds, run.PeakRSSMB, 100*run.PeakRSSToLimit, run.MemoryLimitMiB, run.batchBytes(), run.CPUSeconds, prefixed("; NOT ALL: ", run.Error)),
			target)
	}
}

// largeFig is this build's large-document run, with the baseline's in it.
var largeFig = figure[LargeDocs]{"largeDocuments"}

const targetLargeRSS = "large documents: worker peak RSS under its memory limit"

var largeDocsStage = stage{
	key: "large-docs", figures: []anyFigure{largeFig},
	steps: one("large documents", (*bench).largeDocuments), rows: largeRows, targets: largeTargets,
}

// largeTargets: every event received, the worker's peak RSS under the
// memory limit it ran under.
func largeTargets(r *Results, add addTarget) {
	if ld, ok := largeFig.get(r); ok && ld.MemoryLimitMiB > 0 {
		add(targetLargeRSS, fmt.Sprintf("< %d MiB, all %d received", ld.MemoryLimitMiB, ld.Events),
			fmt.Sprintf("%.1f MiB (%.0f%%), %d of %d received", ld.PeakRSSMB, 100*ld.PeakRSSToLimit, ld.Received, ld.Events),
			ld.PeakRSSMB < float64(ld.MemoryLimitMiB) && ld.Received == ld.Events)
	}
}
