package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
)

// Fleet-fair's shape: 20 outboxes, each written -fair-rate events/s (the
// issue's 5), one of them then given a backlog at once (-fair-flood); the
// steady outboxes' latency before the flood is measured over fairBefore
// after fairWarm.
const (
	fairOutboxes  = 20
	fairDatabases = 2
	fairWarm      = 10 * time.Second
	fairBefore    = 30 * time.Second
)

// FleetFair is whether a flooded outbox starves the others, and how fast
// it drains beside them.
type FleetFair struct {
	Outboxes int     `json:"outboxes"`
	Rate     float64 `json:"ratePerOutbox"`
	Flood    int     `json:"flood"`
	// AloneEventsS is the drain rate of the flood in one outbox relayed
	// alone by one worker: the 0.6x target's base.
	AloneEventsS float64        `json:"aloneEventsPerS"`
	Runs         []FleetFairRun `json:"runs"`
}

// FleetFairRun is one run of the flood beside the steady outboxes.
type FleetFairRun struct {
	Replicas int `json:"replicas"`
	// BeforeP99ms and DuringP99ms are the steady outboxes' latency p99
	// (createdAt to receipt) before the flood and while it drains.
	BeforeP99ms float64 `json:"beforeP99ms"`
	DuringP99ms float64 `json:"duringP99ms"`
	DuringMaxMs float64 `json:"duringMaxMs"`
	// FloodEventsS is the flood's drain rate, Ratio it over AloneEventsS.
	FloodEventsS float64 `json:"floodEventsPerS"`
	Ratio        float64 `json:"ratio"`
	Error        string  `json:"error,omitempty"`
}

// fleetFair measures the flood alone, then beside the steady outboxes on
// one replica and on three.
func (b *bench) fleetFair(ctx context.Context) error {
	f := FleetFair{Outboxes: fairOutboxes, Rate: b.cfg.FairRate, Flood: b.cfg.FairFlood}
	alone, err := b.fairAlone(ctx)
	if err != nil {
		return fmt.Errorf("flood alone: %w", err)
	}
	f.AloneEventsS = round(alone, 1)
	fmt.Fprintf(b.out, "   flood of %d in one outbox alone, one worker: %.1f events/s\n", f.Flood, f.AloneEventsS)
	fleetFairFig.set(b.res, f)
	for _, replicas := range []int{1, 3} {
		run, err := b.fairRun(ctx, replicas)
		if err != nil {
			run.Error = err.Error()
		}
		if f.AloneEventsS > 0 {
			run.Ratio = round(run.FloodEventsS/f.AloneEventsS, 2)
		}
		f.Runs = append(f.Runs, run)
		fleetFairFig.set(b.res, f)
		fmt.Fprintf(b.out, "   %d replica(s): steady p99 %.0f ms before, %.0f ms during the flood (max %.0f); flood %.1f events/s, %.2fx alone %s\n",
			replicas, run.BeforeP99ms, run.DuringP99ms, run.DuringMaxMs, run.FloodEventsS, run.Ratio, run.Error)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// fairAlone drains the flood in one outbox with one worker and returns
// its rate, from the worker's readiness to the last event's receipt.
func (b *bench) fairAlone(ctx context.Context) (float64, error) {
	exchange := fmt.Sprintf("bench.fleet-fair-alone.%d", time.Now().UnixNano())
	boxes, err := b.fleetFile(ctx, "fleet-fair-alone", exchange, 1, 1)
	if err != nil {
		return 0, err
	}
	defer b.dropFleet(boxes)
	if _, err := insertEvents(ctx, boxes.colls[0], b.cfg.FairFlood, 0, eventDoc); err != nil {
		return 0, err
	}
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return 0, err
	}
	defer cons.close()
	ws, err := b.startFleet(ctx, "fair-alone", exchange, boxes.path, 1)
	if err != nil {
		return 0, err
	}
	defer func() { _ = stopAll(ws) }()
	start := time.Now()
	if err := cons.waitFor(ctx, b.cfg.FairFlood, b.cfg.FairDrainMax); err != nil {
		return 0, err
	}
	_, _, last := cons.Snapshot()
	return float64(b.cfg.FairFlood) / last.Sub(start).Seconds(), nil
}

// fairRun is the flood beside the steady outboxes on replicas workers.
func (b *bench) fairRun(ctx context.Context, replicas int) (FleetFairRun, error) {
	run := FleetFairRun{Replicas: replicas}
	exchange := fmt.Sprintf("bench.fleet-fair.%d", time.Now().UnixNano())
	boxes, err := b.fleetFile(ctx, "fleet-fair", exchange, fairOutboxes, fairDatabases)
	if err != nil {
		return run, err
	}
	defer b.dropFleet(boxes)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return run, err
	}
	defer cons.close()
	ws, err := b.startFleet(ctx, fmt.Sprintf("fair-x%d", replicas), exchange, boxes.path, replicas)
	if err != nil {
		return run, err
	}
	defer func() { _ = stopAll(ws) }()
	prodCtx, stopProducers := context.WithCancel(ctx)
	p := &steadyProducers{created: map[string]time.Time{}}
	p.start(prodCtx, boxes.colls[1:], b.cfg.FairRate)
	defer func() { stopProducers(); p.wg.Wait() }()
	if !backoff.Sleep(ctx, fairWarm+fairBefore) {
		return run, ctx.Err()
	}
	floodStart := time.Now()
	if _, err := insertEvents(ctx, boxes.colls[0], b.cfg.FairFlood, 0, eventDoc); err != nil {
		return run, err
	}
	floodEnd, drained, floodErr := p.waitFlood(ctx, cons, b.cfg.FairFlood, b.cfg.FairDrainMax)
	stopProducers()
	p.wg.Wait()
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	// The steady events still on their way, when the flood drained; a
	// flood that did not drain leaves them a minute.
	_ = cons.waitFor(ctx, drained+len(p.created), time.Minute)
	first := cons.FirstArrivals()
	before := p.latencies(first, floodStart.Add(-fairBefore), floodStart)
	during := p.latencies(first, floodStart, floodEnd)
	run.BeforeP99ms = round(percentile(before, 99), 0)
	run.DuringP99ms = round(percentile(during, 99), 0)
	run.DuringMaxMs = round(percentile(during, 100), 0)
	run.FloodEventsS = round(float64(drained)/floodEnd.Sub(floodStart).Seconds(), 1)
	return run, floodErr
}

// startFleet starts replicas workers on the fleet file and waits for
// them to be ready.
func (b *bench) startFleet(ctx context.Context, name, exchange, file string, replicas int) ([]*workerProc, error) {
	var ws []*workerProc
	for i := range replicas {
		w, err := b.startWorker(workerOpts{id: fmt.Sprintf("%s-%d", name, i), collection: "unused", exchange: exchange, defaults: true,
			env: []string{"OUTBOX_FLEET_FILE=" + file}})
		if err != nil {
			_ = stopAll(ws)
			return nil, err
		}
		ws = append(ws, w)
	}
	for _, w := range ws {
		if err := w.waitReady(ctx, 5*time.Minute); err != nil {
			_ = stopAll(ws)
			return nil, err
		}
	}
	return ws, nil
}

// steadyProducers write each of their outboxes rate events/s on a fixed
// timetable, and note each event's createdAt.
type steadyProducers struct {
	mu      sync.Mutex
	created map[string]time.Time
	wg      sync.WaitGroup
}

func (p *steadyProducers) start(ctx context.Context, colls []*driver.Collection, rate float64) {
	interval := time.Duration(float64(time.Second) / rate)
	for i, coll := range colls {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			// Spread the outboxes' timetables over the interval.
			start := time.Now().Add(interval * time.Duration(i) / time.Duration(len(colls)))
			for n := 0; ; n++ {
				if !backoff.Sleep(ctx, time.Until(start.Add(time.Duration(n)*interval))) {
					return
				}
				p.insert(ctx, coll, n)
			}
		}()
	}
}

// insert writes one event and notes its createdAt as stored
// (milliseconds).
func (p *steadyProducers) insert(ctx context.Context, coll *driver.Collection, n int) {
	doc, err := eventDoc(n, time.Now())
	if err != nil {
		return
	}
	if _, err := coll.InsertOne(ctx, doc); err != nil {
		return // the producers' end; a failed insert is not an event
	}
	id, _ := value(doc, events.FieldID).(bson.ObjectID)
	at, _ := value(doc, events.FieldCreatedAt).(time.Time)
	p.mu.Lock()
	p.created[id.Hex()] = at.Truncate(time.Millisecond)
	p.mu.Unlock()
}

// waitFlood waits until the consumer has received flood events that are
// not the producers', or drainMax has passed, and returns when the last
// of them arrived and how many did (at drainMax: the time then, and an
// error that says how far the flood got).
func (p *steadyProducers) waitFlood(ctx context.Context, cons *consumer, flood int, drainMax time.Duration) (time.Time, int, error) {
	deadline := time.Now().Add(drainMax)
	n := 0
	for time.Now().Before(deadline) {
		var last time.Time
		n = 0
		p.mu.Lock()
		for id, at := range cons.FirstArrivals() {
			if _, steady := p.created[id]; !steady {
				n++
				if at.After(last) {
					last = at
				}
			}
		}
		p.mu.Unlock()
		if n >= flood {
			return last, n, nil
		}
		if !backoff.Sleep(ctx, time.Second) {
			return time.Now(), n, ctx.Err()
		}
	}
	return time.Now(), n, fmt.Errorf("the flood drained %d of %d events within %s", n, flood, drainMax)
}

// latencies are the sorted latencies, in ms, of the producers' events
// created in [from, to).
func (p *steadyProducers) latencies(first map[string]time.Time, from, to time.Time) []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []float64
	for id, c := range p.created {
		if c.Before(from) || !c.Before(to) {
			continue
		}
		if r, ok := first[id]; ok {
			out = append(out, float64(r.Sub(c))/float64(time.Millisecond))
		}
	}
	slices.Sort(out)
	return out
}

// fleetFairFig is the fairness of the fleet under a flood.
var fleetFairFig = figure[FleetFair]{"fleetFair"}

var fleetFairStage = stage{
	key: "fleet-fair", optIn: true, figures: []anyFigure{fleetFairFig},
	steps: one("fleet fairness: 20 outboxes, one flooded", (*bench).fleetFair),
	rows:  fleetFairRows, targets: fleetFairTargets,
}

func fleetFairRows(r *Results, add addRow) {
	f, ok := fleetFairFig.get(r)
	if !ok {
		return
	}
	add(fmt.Sprintf("Fleet fairness: flood of %s in one outbox alone, one worker", thousands(f.Flood)), fmt.Sprintf("%.1f events/s", f.AloneEventsS), "")
	for _, run := range f.Runs {
		result := fmt.Sprintf("steady p99 %.0f ms before, %.0f ms during (max %.0f); flood %.1f events/s, %.2fx alone",
			run.BeforeP99ms, run.DuringP99ms, run.DuringMaxMs, run.FloodEventsS, run.Ratio)
		if run.Error != "" {
			result += "; " + run.Error
		}
		add(fmt.Sprintf("Fleet fairness, %d outboxes at %.0f events/s, flood of %s in one, %d replica(s)", f.Outboxes, f.Rate, thousands(f.Flood), run.Replicas), result, "")
	}
}

func fleetFairTargets(r *Results, add addTarget) {
	f, ok := fleetFairFig.get(r)
	if !ok {
		return
	}
	for _, run := range f.Runs {
		if run.FloodEventsS == 0 && run.BeforeP99ms == 0 {
			continue // nothing measured
		}
		grew := run.DuringP99ms - run.BeforeP99ms
		add(fmt.Sprintf("fleet fair latency, %d replica(s)", run.Replicas), "steady p99 within 2 s of before the flood",
			fmt.Sprintf("+%.0f ms", grew), grew <= 2000)
		add(fmt.Sprintf("fleet fair drain, %d replica(s)", run.Replicas), ">= 0.6x one outbox alone",
			fmt.Sprintf("%.2fx", run.Ratio), run.Ratio >= 0.6)
	}
}
