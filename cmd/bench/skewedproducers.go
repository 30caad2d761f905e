package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/benchorder"
)

const (
	skewIDPrefix = "skew-"
	// producerSkew is how far apart the two producers' clocks are.
	producerSkew = 2 * time.Second
	// skewInterval is the real time between two versions of the aggregate.
	skewInterval = 5 * time.Millisecond
)

// SkewedProducers is one worker relaying one aggregate that two producers
// write while it runs, their clocks producerSkew apart: with the
// aggregate's version in sequence, and without (createdAt alone).
type SkewedProducers struct {
	Events        int     `json:"events"`
	SkewSeconds   float64 `json:"skewSeconds"`
	WithSequence  SkewRun `json:"withSequence"`
	CreatedAtOnly SkewRun `json:"createdAtOnly"`
}

// SkewRun is one run of the skewed-producers stage.
type SkewRun struct {
	Sequence   bool    `json:"sequence"`
	Received   int     `json:"received"`
	Deliveries int     `json:"deliveries"`
	Seconds    float64 `json:"seconds"`
	// Inversions counts the versions whose first delivery came after the
	// first delivery of a later version: 0 is the guarantee with sequence.
	Inversions int `json:"inversions"`
	// Anomalies are the worker's outbox_sequence_anomalies_total by kind,
	// those above 0.
	Anomalies map[string]float64 `json:"anomalies,omitempty"`
}

// skewedProducers runs the stage: with sequence, then without.
func (b *bench) skewedProducers(ctx context.Context) error {
	s := SkewedProducers{Events: b.cfg.SkewEvents, SkewSeconds: producerSkew.Seconds()}
	var err error
	if s.WithSequence, err = b.skewRun(ctx, s.Events, true); err != nil {
		return err
	}
	if s.CreatedAtOnly, err = b.skewRun(ctx, s.Events, false); err != nil {
		return err
	}
	skewFig.set(b.res, s)
	for _, r := range []SkewRun{s.WithSequence, s.CreatedAtOnly} {
		fmt.Fprintf(b.out, "   sequence %t: %d of %d in %.1fs; %d inversions; sequence anomalies counted: %s\n",
			r.Sequence, r.Received, s.Events, r.Seconds, r.Inversions, describeAnomalies(r.Anomalies))
	}
	if s.WithSequence.Inversions > 0 {
		fmt.Fprintf(b.out, "   ORDER VIOLATED: with sequence, %d versions were delivered after a later one\n", s.WithSequence.Inversions)
	}
	return nil
}

// skewRun starts one worker, then has producers a (clock producerSkew
// behind) and b (on time) take turns writing versions 0 to n-1 of one
// aggregate, skewInterval apart in real time, as two application servers
// serialized by the aggregate's version would: every version a writes has
// a createdAt before the one b wrote just before it. The consumer checks
// the order of first deliveries.
func (b *bench) skewRun(ctx context.Context, n int, sequence bool) (SkewRun, error) {
	run := SkewRun{Sequence: sequence}
	name := fmt.Sprintf("skew_%t", sequence)
	coll, _, err := b.preparedCollection(ctx, name)
	if err != nil {
		return run, err
	}
	defer dropQuietly(coll)
	exchange := uniqueName("bench-" + name)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return run, err
	}
	defer cons.close()
	w, err := b.startWorker(workerOpts{id: "bench-" + name, collection: coll.Name(), exchange: exchange, schedule: b.cfg.DrainSched})
	if err != nil {
		return run, err
	}
	defer w.Kill()

	start := time.Now()
	for v := range n {
		clock := time.Now()
		if v%2 == 1 { // producer a
			clock = clock.Add(-producerSkew)
		}
		d := events.Draft{
			ID:   fmt.Sprintf("%s%08d", skewIDPrefix, v),
			Type: "order.updated", AggregateType: "order", AggregateID: "order-skewed",
			Payload: bson.D{{Key: "orderId", Value: "order-skewed"}, {Key: "version", Value: v}, {Key: "note", Value: benchorder.Note}},
		}
		if sequence {
			version := int64(v)
			d.Sequence = &version
		}
		doc, err := d.Document(clock)
		if err != nil {
			return run, err
		}
		if _, err := coll.InsertOne(ctx, doc); err != nil {
			return run, fmt.Errorf("insert version %d: %w", v, err)
		}
		time.Sleep(skewInterval)
	}
	if err := cons.waitFor(ctx, n, drainTimeout); err != nil {
		return run, err
	}
	order, last := cons.Order()
	run.Seconds = round(last.Sub(start).Seconds(), 2)
	if run.Anomalies, err = sequenceAnomalies(ctx, w); err != nil {
		return run, err
	}
	if _, err := w.stop(stopTimeout); err != nil {
		return run, err
	}
	_, run.Deliveries = cons.snapshot()
	run.Received = len(order)
	run.Inversions, err = inversionsOf(skewIDPrefix, order)
	return run, err
}

var anomalyLine = regexp.MustCompile(`^outbox_sequence_anomalies_total\{kind="([a-z]+)"\} ([0-9.e+]+)$`)

// sequenceAnomalies reads the worker's outbox_sequence_anomalies_total,
// the kinds above 0.
func sequenceAnomalies(ctx context.Context, w *workerProc) (map[string]float64, error) {
	pr, pw := io.Pipe()
	go func() {
		_, err := httpGet(ctx, "http://"+w.addr+"/metrics", pw)
		pw.CloseWithError(err)
	}()
	out := map[string]float64{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if m := anomalyLine.FindStringSubmatch(withoutOutbox(sc.Text())); m != nil {
			if v, _ := strconv.ParseFloat(m[2], 64); v > 0 {
				out[m[1]] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape %s: %w", w.id, err)
	}
	return out, nil
}

// skewFig is the skewed-producers stage's runs.
var skewFig = figure[SkewedProducers]{"skewedProducers"}

const targetSkewOrder = "skewed producers' aggregate delivered in version order"

var skewedProducersStage = stage{
	key: "skewed-producers", figures: []anyFigure{skewFig},
	steps: one("skewed producers", (*bench).skewedProducers), rows: skewRows, targets: skewTargets,
}

func skewRows(r *Results, add addRow) {
	s, ok := skewFig.get(r)
	if !ok {
		return
	}
	for _, run := range []SkewRun{s.WithSequence, s.CreatedAtOnly} {
		measure := fmt.Sprintf("Skewed producers: %s versions of one aggregate from two producers %.0f s apart, 1 worker, ", thousands(s.Events), s.SkewSeconds)
		target := ""
		if run.Sequence {
			measure += "with sequence"
			target = targetSkewOrder
		} else {
			measure += "createdAt only"
		}
		add(measure, fmt.Sprintf("%s inversions, %s of %s received in %.1f s; sequence anomalies counted: %s",
			thousands(run.Inversions), thousands(run.Received), thousands(s.Events), run.Seconds, describeAnomalies(run.Anomalies)), target)
	}
}

// describeAnomalies writes the counts by kind, "none" without any.
func describeAnomalies(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, kind := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %s", kind, thousands(int(m[kind]))))
	}
	return strings.Join(parts, ", ")
}

// skewTargets: no inversion with sequence.
func skewTargets(r *Results, add addTarget) {
	if s, ok := skewFig.get(r); ok {
		add(targetSkewOrder, "0 inversions", fmt.Sprintf("%d inversions", s.WithSequence.Inversions), s.WithSequence.Inversions == 0)
	}
}
