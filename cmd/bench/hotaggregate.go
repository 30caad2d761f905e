package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/benchorder"
)

const hotIDPrefix = "hot-"

// HotAggregate is one worker relaying a backlog that is all one
// aggregate, with ordering on and off.
type HotAggregate struct {
	Events    int     `json:"events"`
	Ordered   HotRun  `json:"ordered"`
	Unordered HotRun  `json:"unordered"`
	Ratio     float64 `json:"orderedToUnordered"` // Ordered.PerSecond / Unordered.PerSecond
}

// HotRun is one run of the hot-aggregate stage.
type HotRun struct {
	Ordering   string  `json:"ordering"` // OUTBOX_ORDERING
	Received   int     `json:"received"` // distinct events
	Deliveries int     `json:"deliveries"`
	Duplicates int     `json:"duplicates"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"perSecond"`
	// Inversions counts events whose first delivery came after the first
	// delivery of a later event of the aggregate; 0 is the guarantee of
	// the ordered run.
	Inversions        int     `json:"inversions"`
	DBCommandsPer1000 float64 `json:"dbCommandsPer1000"`
}

// hotAggregate relays a backlog of one aggregate (createdAt one
// millisecond apart) with one worker, ordered (the default), then the same
// backlog with OUTBOX_ORDERING=none, and compares the rates. An inversion
// in the ordered run is an unmet target.
func (b *bench) hotAggregate(ctx context.Context) error {
	n := b.cfg.HotEvents
	h := HotAggregate{Events: n}
	var err error
	if h.Ordered, err = b.hotRun(ctx, n, orderingAggregate); err != nil {
		return err
	}
	if h.Unordered, err = b.hotRun(ctx, n, orderingNone); err != nil {
		return err
	}
	h.Ratio = round(ratio(h.Ordered.PerSecond, h.Unordered.PerSecond), 3)
	hotFig.set(b.res, h)
	for _, r := range []HotRun{h.Ordered, h.Unordered} {
		fmt.Fprintf(b.out, "   OUTBOX_ORDERING=%s: %d of %d in %.1fs: %.0f/s; %d inversions, %d duplicates; %.1f database commands per 1,000 events\n",
			r.Ordering, r.Received, n, r.Seconds, r.PerSecond, r.Inversions, r.Duplicates, r.DBCommandsPer1000)
	}
	if h.Ordered.Inversions > 0 {
		// Reported as an unmet target rather than an error, so that the
		// rest of the run still measures.
		fmt.Fprintf(b.out, "   ORDER VIOLATED: the ordered run delivered %d events after a later event of the aggregate\n", h.Ordered.Inversions)
	}
	return nil
}

// hotRun is one worker relaying n events of one aggregate with
// OUTBOX_ORDERING=ordering.
func (b *bench) hotRun(ctx context.Context, n int, ordering string) (HotRun, error) {
	run := HotRun{Ordering: ordering}
	coll, _, err := b.preparedCollection(ctx, "hot_"+ordering)
	if err != nil {
		return run, err
	}
	defer dropQuietly(coll)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	if _, err := insertEvents(ctx, coll, n, 0, func(i int, _ time.Time) (bson.D, error) {
		return hotDoc(i, base)
	}); err != nil {
		return run, err
	}
	exchange := uniqueName("bench-hot-" + ordering)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return run, err
	}
	defer cons.close()

	start := time.Now()
	w, err := b.startWorker(workerOpts{
		id:         "bench-hot-" + ordering,
		collection: coll.Name(),
		exchange:   exchange,
		schedule:   b.cfg.DrainSched,
		env:        []string{"OUTBOX_ORDERING=" + ordering},
	})
	if err != nil {
		return run, err
	}
	defer w.Kill()
	if err := cons.waitFor(ctx, n, drainTimeout); err != nil {
		return run, err
	}
	order, last := cons.Order()
	elapsed := last.Sub(start)
	_, cmds, err := w.scrape(ctx)
	if err != nil {
		return run, err
	}
	if _, err := w.stop(stopTimeout); err != nil {
		return run, err
	}
	_, run.Deliveries = cons.snapshot()
	run.Received = len(order)
	run.Duplicates = run.Deliveries - run.Received
	if run.Inversions, err = inversions(order); err != nil {
		return run, err
	}
	run.Seconds = round(elapsed.Seconds(), 2)
	run.PerSecond = round(float64(run.Received)/elapsed.Seconds(), 0)
	var total float64
	for _, v := range cmds {
		total += v
	}
	run.DBCommandsPer1000 = round(total/(float64(n)/1000), 1)
	return run, nil
}

// hotDoc is event i of the hot aggregate: one aggregate id for all, ids
// that name their position, createdAt one millisecond after event i-1.
func hotDoc(i int, base time.Time) (bson.D, error) {
	return events.Draft{
		ID:            fmt.Sprintf("%s%08d", hotIDPrefix, i),
		Type:          "order.updated",
		AggregateType: "order",
		AggregateID:   "order-hot",
		Payload: bson.D{
			{Key: "orderId", Value: "order-hot"},
			{Key: "version", Value: i},
			{Key: "note", Value: benchorder.Note},
		},
	}.Document(base.Add(time.Duration(i) * time.Millisecond))
}

// inversions counts the events of order (message ids of the hot
// aggregate, in order of first delivery) that came after a later event.
func inversions(order []string) (int, error) { return inversionsOf(hotIDPrefix, order) }

// inversionsOf counts the events of order (message ids of one aggregate,
// prefix and the event's position, in order of first delivery) that came
// after a later event.
func inversionsOf(prefix string, order []string) (int, error) {
	latest, count := -1, 0
	for _, id := range order {
		pos, err := strconv.Atoi(strings.TrimPrefix(id, prefix))
		if err != nil || !strings.HasPrefix(id, prefix) {
			return 0, errors.Join(fmt.Errorf("message id %q is not one of the aggregate's (%s)", id, prefix), err)
		}
		if pos < latest {
			count++
			continue
		}
		latest = pos
	}
	return count, nil
}

// hotFig is the hot-aggregate stage's runs.
var hotFig = figure[HotAggregate]{"hotAggregate"}

const targetHotOrder = "hot aggregate delivered in order"

var hotAggregateStage = stage{
	key: "hot-aggregate", figures: []anyFigure{hotFig},
	steps: one("hot aggregate", (*bench).hotAggregate), rows: hotRows, targets: hotTargets,
}

func hotRows(r *Results, add addRow) {
	h, ok := hotFig.get(r)
	if !ok {
		return
	}
	for _, run := range []HotRun{h.Ordered, h.Unordered} {
		result := fmt.Sprintf("%s events/s (%s of %s in %.1f s); %s inversions, %s duplicate deliveries; %.1f database commands per 1,000 events",
			thousands(int(run.PerSecond)), thousands(run.Received), thousands(h.Events), run.Seconds,
			thousands(run.Inversions), thousands(run.Duplicates), run.DBCommandsPer1000)
		target := ""
		if run.Ordering == orderingAggregate {
			target = targetHotOrder
			if h.Ratio > 0 {
				result += fmt.Sprintf("; %.0f%% of the unordered rate", 100*h.Ratio)
			}
		}
		add(fmt.Sprintf("Hot aggregate: %s events of one aggregate, 1 worker, OUTBOX_ORDERING=%s", thousands(h.Events), run.Ordering), result, target)
	}
}

// hotTargets: no inversion in the ordered run.
func hotTargets(r *Results, add addTarget) {
	if h, ok := hotFig.get(r); ok {
		add(targetHotOrder, "0 inversions", fmt.Sprintf("%d inversions", h.Ordered.Inversions), h.Ordered.Inversions == 0)
	}
}
