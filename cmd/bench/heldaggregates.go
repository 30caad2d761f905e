package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/benchorder"
)

// The held-aggregates stage: aggregates held by FAILED events,
// each with NEW events waiting behind it, at the head of the claim's
// order, ahead of a healthy backlog. One worker at its defaults
// (ordering on, OUTBOX_ORDERING_AFTER_FAILED=wait) must relay every
// healthy event and none of the held ones.
const (
	// heldAggregates is more aggregates than a claim of the default 500
	// can name to the server, the case mongo/held_test.go tests.
	heldAggregates = 2000
	heldWaiting    = 2 // NEW events behind each held aggregate's FAILED one
	// heldHealthy healthy NEW events, heldHealthyPerAgg to an aggregate:
	// six claims of 500, which keeps each worker's run near 20 s here
	// (FerretDB reads the 4,000 waiting events on every claim too).
	heldHealthy       = 3000
	heldHealthyPerAgg = 3
	// heldReferenceLimit bounds the run without held aggregates; the runs
	// with them get a minute more than three times what it took.
	heldReferenceLimit = 3 * time.Minute

	heldAggregateType = "held"
	heldIDPrefix      = "held-"
	healthyIDPrefix   = "ok-"
)

// HeldAggregates is the held-aggregates stage: the healthy backlog relayed
// behind the held aggregates by each build, and by this build alone.
type HeldAggregates struct {
	Aggregates          int `json:"heldAggregates"`
	WaitingPerAggregate int `json:"waitingPerAggregate"`
	Healthy             int `json:"healthy"`
	HealthyPerAggregate int `json:"healthyPerAggregate"`
	// Without is this build's worker on the same healthy backlog with no
	// held aggregate, the reference for the others' cost.
	Without *HeldRun `json:"withoutHeld,omitempty"`
	// With are this build's worker, then the -baseline one if any, each
	// on a fresh backlog with the held aggregates.
	With []HeldRun `json:"withHeld"`
}

// HeldRun is one worker process relaying the stage's healthy events.
type HeldRun struct {
	WorkerBuild
	// Held says whether the backlog had the held aggregates ahead of the
	// healthy events.
	Held bool `json:"held"`
	// Healthy is the distinct healthy events received; Deliveries counts
	// every message, held ones and duplicates too.
	Healthy    int  `json:"healthyDelivered"`
	AllHealthy bool `json:"allHealthyDelivered"`
	Deliveries int  `json:"deliveries"`
	// HeldDelivered is the distinct held events received; HeldChanged the
	// held events (FAILED and waiting NEW) no longer in the status they
	// were inserted with once the worker stopped. Both must be 0.
	HeldDelivered int `json:"heldDelivered"`
	HeldChanged   int `json:"heldChanged"`
	// FirstSeconds runs from the process's start to the first healthy
	// event's receipt; Seconds to the last one's, or to the deadline when
	// not all arrived. PerSecond is the healthy events over Seconds.
	FirstSeconds float64 `json:"firstHealthySeconds"`
	Seconds      float64 `json:"seconds"`
	PerSecond    float64 `json:"perSecond"`
	// The per-1,000 figures are per 1,000 healthy events delivered.
	WorkerCost
}

// heldAggregatesRun runs this build's worker on the healthy backlog
// alone, then each build's (-worker, -baseline) on the held aggregates
// and the same healthy backlog behind them.
func (b *bench) heldAggregatesRun(ctx context.Context) error {
	fmt.Fprintf(b.out, "   %s aggregates held by FAILED events (%d NEW waiting each) ahead of %s healthy NEW events, %d to an aggregate; 1 worker at its defaults\n",
		thousands(heldAggregates), heldWaiting, thousands(heldHealthy), heldHealthyPerAgg)
	h := HeldAggregates{Aggregates: heldAggregates, WaitingPerAggregate: heldWaiting, Healthy: heldHealthy, HealthyPerAggregate: heldHealthyPerAgg}
	without, err := b.heldRun(ctx, WorkerBuild{buildCurrent, b.cfg.WorkerBin}, false, heldReferenceLimit)
	if err != nil {
		return err
	}
	h.Without = &without
	fmt.Fprintf(b.out, "   without held aggregates (%s): %s\n", without.Build, without.describe())
	timeout := heldReferenceLimit
	if without.AllHealthy {
		timeout = time.Minute + time.Duration(3*without.Seconds*float64(time.Second))
	}
	for _, bin := range b.workerBinaries() {
		r, err := b.heldRun(ctx, bin, true, timeout)
		if err != nil {
			return err
		}
		h.With = append(h.With, r)
		fmt.Fprintf(b.out, "   with held aggregates (%s): %s\n", r.Build, r.describe())
		if r.HeldDelivered > 0 || r.HeldChanged > 0 {
			fmt.Fprintf(b.out, "   ORDER VIOLATED (%s): %d held events delivered, %d changed status\n", r.Build, r.HeldDelivered, r.HeldChanged)
		}
	}
	heldFig.set(b.res, h)
	return nil
}

// heldRun is one worker process of bin at its defaults on a fresh
// backlog: the healthy events, behind the held aggregates when held. A
// worker that does not deliver every healthy event within timeout is a
// result, in HeldRun.Error.
func (b *bench) heldRun(ctx context.Context, bin WorkerBuild, held bool, timeout time.Duration) (HeldRun, error) {
	label := strings.ReplaceAll(bin.Build, " ", "-")
	if !held {
		label = "no-held"
	}
	coll, _, err := b.preparedCollection(ctx, "held_"+strings.ReplaceAll(label, "-", "_"))
	if err != nil {
		return HeldRun{}, err
	}
	defer dropQuietly(coll)
	heldDocs, err := insertHeldBacklog(ctx, coll, held)
	if err != nil {
		return HeldRun{}, err
	}
	exchange := uniqueName("bench-held-" + label)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return HeldRun{}, err
	}
	defer cons.close()

	start := time.Now()
	w, err := b.startWorker(workerOpts{
		id: "bench-held-" + label, collection: coll.Name(), exchange: exchange,
		bin: bin.Binary, defaults: true,
	})
	if err != nil {
		return HeldRun{}, err
	}
	defer w.Kill()

	out := HeldRun{WorkerBuild: bin, Held: held}
	if err := cons.waitForPrefix(ctx, healthyIDPrefix, heldHealthy, timeout); err != nil {
		if ctx.Err() != nil {
			return HeldRun{}, ctx.Err()
		}
		out.Error = err.Error()
	}
	var healthyAt []time.Time
	for id, at := range cons.FirstArrivals() {
		if strings.HasPrefix(id, healthyIDPrefix) {
			healthyAt = append(healthyAt, at)
		}
	}
	out.Healthy = len(healthyAt)
	out.AllHealthy = out.Healthy == heldHealthy
	elapsed := time.Since(start)
	if out.AllHealthy {
		elapsed = slices.MaxFunc(healthyAt, time.Time.Compare).Sub(start)
	}
	if len(healthyAt) > 0 {
		out.FirstSeconds = round(slices.MinFunc(healthyAt, time.Time.Compare).Sub(start).Seconds(), 2)
	}
	if _, cmds, err := w.scrape(ctx); err == nil {
		out.DBCommands = cmds
	}
	st, stopErr := w.stop(stopTimeout)
	// What the worker published before it stopped has reached the
	// consumer or is on its way; the database says what it claimed.
	arrivals, deliveries := cons.snapshot()
	out.Deliveries = deliveries
	for id := range arrivals {
		if strings.HasPrefix(id, heldIDPrefix) {
			out.HeldDelivered++
		}
	}
	if held {
		unchanged, err := heldUnchanged(ctx, coll)
		if err != nil {
			return HeldRun{}, err
		}
		out.HeldChanged = heldDocs - unchanged
	}
	out.Seconds = round(elapsed.Seconds(), 2)
	out.PerSecond = round(float64(out.Healthy)/elapsed.Seconds(), 1)
	out.record(st, stopErr, out.Healthy)
	return out, nil
}

// insertHeldBacklog inserts the stage's healthy events into coll, behind
// the held aggregates when held, and returns how many held documents
// (FAILED and waiting NEW) it inserted.
func insertHeldBacklog(ctx context.Context, coll *driver.Collection, held bool) (int, error) {
	heldDocs := 0
	if held {
		heldDocs = heldAggregates * (1 + heldWaiting)
	}
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	_, err := insertEvents(ctx, coll, heldDocs+heldHealthy, 0, func(i int, _ time.Time) (bson.D, error) {
		if i < heldDocs {
			return heldDocOf(i, heldWaiting, base)
		}
		return healthyDocOf(i-heldDocs, heldHealthyPerAgg, base)
	})
	return heldDocs, err
}

// heldUnchanged counts the held aggregates' events still in the status
// they were inserted with: FAILED, and NEW behind it. Each count is an
// equality filter, which FerretDB pushes down.
func heldUnchanged(ctx context.Context, coll *driver.Collection) (int, error) {
	total := 0
	for _, s := range []events.Status{events.StatusFailed, events.StatusNew} {
		n, err := coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: s}, {Key: events.FieldAggregateType, Value: heldAggregateType}})
		if err != nil {
			return 0, fmt.Errorf("count held %s events: %w", s, err)
		}
		total += int(n)
	}
	return total, nil
}

// heldDocOf is document i of the held aggregates, 1+waiting to an
// aggregate: the FAILED event that holds it (what a worker leaves after
// the last attempt), then the NEW events waiting behind it, one
// millisecond apart, all older than every healthy event.
func heldDocOf(i, waiting int, base time.Time) (bson.D, error) {
	agg, pos := i/(1+waiting), i%(1+waiting)
	id := fmt.Sprintf("%s%04d-%d", heldIDPrefix, agg, pos)
	doc, err := events.Draft{
		ID: id, Type: "order.updated", AggregateType: heldAggregateType, AggregateID: fmt.Sprintf("%s%04d", heldIDPrefix, agg),
		Payload: bson.D{{Key: "orderId", Value: id}, {Key: "note", Value: benchorder.Note}},
	}.Document(base.Add(time.Duration(pos) * time.Millisecond))
	if err != nil || pos > 0 {
		return doc, err
	}
	for j := range doc {
		if doc[j].Key == events.FieldStatus {
			doc[j].Value = events.StatusFailed
		}
	}
	return append(doc,
		bson.E{Key: events.FieldAttempts, Value: 5},
		bson.E{Key: events.FieldLastError, Value: "bench: publish refused"},
		bson.E{Key: events.FieldFailedAt, Value: base},
	), nil
}

// healthyDocOf is healthy event i: perAgg to an aggregate, createdAt a
// second after base and one millisecond apart.
func healthyDocOf(i, perAgg int, base time.Time) (bson.D, error) {
	id := fmt.Sprintf("%s%05d", healthyIDPrefix, i)
	return events.Draft{
		ID: id, Type: "order.created", AggregateType: "order", AggregateID: fmt.Sprintf("order-ok-%04d", i/perAgg),
		Payload: bson.D{{Key: "orderId", Value: id}, {Key: "note", Value: benchorder.Note}},
	}.Document(base.Add(time.Second + time.Duration(i)*time.Millisecond))
}

// waitForPrefix waits until n distinct messages whose id starts with
// prefix have arrived, or timeout; messages of other ids do not count.
func (c *consumer) waitForPrefix(ctx context.Context, prefix string, n int, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		order, _ := c.Order()
		got := 0
		for _, id := range order {
			if strings.HasPrefix(id, prefix) {
				got++
			}
		}
		if got >= n {
			return nil
		}
		// The others stay counted: wait for as many more of any id as
		// are missing.
		if err := c.WaitDistinct(wctx, len(order)+n-got); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("received %d distinct %s events of %d within %s", got, strings.TrimSuffix(prefix, "-"), n, timeout)
		}
	}
}

// describe is the run's figures in one line, for the table and the
// progress output.
func (r HeldRun) describe() string {
	heldPart := ""
	if r.Held {
		heldPart = fmt.Sprintf("%s held events delivered, %s changed; ", thousands(r.HeldDelivered), thousands(r.HeldChanged))
	}
	if r.Healthy == 0 {
		return fmt.Sprintf("no healthy event of %s in %.1f s; %sCPU %.2f s in all, %.0f database commands%s",
			thousands(heldHealthy), r.Seconds, heldPart, r.CPUSeconds, sum(r.DBCommands), prefixed("; ", r.Error))
	}
	return fmt.Sprintf("%s healthy events/s (%s of %s in %.1f s, first after %.1f s); %s"+
		"CPU %.1f ms and %.1f database commands per 1,000 healthy events (commands in all: %s); peak RSS %.1f MB%s",
		thousands(int(r.PerSecond)), thousands(r.Healthy), thousands(heldHealthy), r.Seconds, r.FirstSeconds,
		heldPart, r.CPUMsPer1000, r.DBCommandsPer1000, strings.Trim(topCommands(r.DBCommands, 4), "()"),
		r.PeakRSSMB, prefixed("; ", r.Error))
}

// heldFig is the held-aggregates stage's runs.
var heldFig = figure[HeldAggregates]{"heldAggregates"}

const (
	targetHeldNone = "held aggregates: no held event delivered"
	targetHeldAll  = "held aggregates: every healthy event delivered"
)

var heldAggregatesStage = stage{
	key: "held-aggregates", figures: []anyFigure{heldFig},
	steps: one("held aggregates", (*bench).heldAggregatesRun), rows: heldRows, targets: heldTargets,
}

// heldRows adds the table rows of the held-aggregates stage: each build's
// worker with the held aggregates, this build's without, then whether
// this build delivered every healthy event.
func heldRows(r *Results, add addRow) {
	h, ok := heldFig.get(r)
	if !ok {
		return
	}
	backlog := fmt.Sprintf("%s healthy NEW events (%d to an aggregate)", thousands(h.Healthy), h.HealthyPerAggregate)
	for _, w := range h.With {
		result := w.describe()
		if h.Without != nil && h.Without.PerSecond > 0 && w.Healthy > 0 {
			result += fmt.Sprintf("; %.2fx the rate and %.2fx the commands per 1,000 without them",
				ratio(w.PerSecond, h.Without.PerSecond), ratio(w.DBCommandsPer1000, h.Without.DBCommandsPer1000))
		}
		target := ""
		if w.isCurrent() {
			target = targetHeldNone
		}
		add(fmt.Sprintf("Held aggregates: %s behind %s aggregates held by FAILED events (%d NEW waiting each), 1 worker at its defaults (%s)",
			backlog, thousands(h.Aggregates), h.WaitingPerAggregate, w.Build), result, target)
	}
	if w := h.Without; w != nil {
		add(fmt.Sprintf("Held aggregates: the same %s with no held aggregate, 1 worker at its defaults (%s)", backlog, w.Build), w.describe(), "")
	}
	if w, ok := currentOf(h.With); ok {
		add("Held aggregates: every healthy event delivered (this build)",
			fmt.Sprintf("%s of %s", thousands(w.Healthy), thousands(h.Healthy)), targetHeldAll)
	}
}

// heldTargets: this build delivered no held event, changed none, and
// delivered every healthy one.
func heldTargets(r *Results, add addTarget) {
	h, ok := heldFig.get(r)
	if !ok {
		return
	}
	if w, ok := currentOf(h.With); ok {
		add(targetHeldNone, "0 delivered, 0 changed",
			fmt.Sprintf("%d delivered, %d changed", w.HeldDelivered, w.HeldChanged), w.HeldDelivered == 0 && w.HeldChanged == 0)
		add(targetHeldAll, fmt.Sprintf("all %s", thousands(h.Healthy)),
			fmt.Sprintf("%s of %s", thousands(w.Healthy), thousands(h.Healthy)), w.AllHealthy)
	}
}
