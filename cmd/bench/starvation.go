package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/benchorder"
)

// The starvation stages: four replicas at their defaults, and at the head
// of the outbox a large backlog none of them may take, with a few hundred
// healthy events behind it, spread over as many aggregates so that every
// replica owns some. "paused-head" is NEW events of a type paused with
// the worker's pause (mongo.Store.Pause, as `worker pause` does); after
// the healthy phase the type is resumed and the paused events drain.
// "held-head" is aggregates held by a FAILED event each, with NEW events
// waiting behind it. Every replica must publish its share of the healthy
// events, and none of the head. Both are opt-in: on FerretDB the issue's
// sizes take minutes per build.
const (
	starveReplicas      = 4
	starveHeldWaiting   = 5 // NEW events behind each held aggregate's FAILED one
	starvePausedType    = "bench.paused"
	starvePausedIDs     = "paused-"
	starvePausedAggs    = 5000 // the paused events' aggregates
	starveDrainDeadline = 30 * time.Minute
)

// Starvation is one starvation stage: its head, and each build's run.
type Starvation struct {
	Key  string `json:"key"`
	Name string `json:"name"`
	// Head is the paused events, or the held aggregates; HeadDocs the
	// documents ahead of the healthy events.
	Head     int         `json:"head"`
	HeadDocs int         `json:"headDocuments"`
	Healthy  int         `json:"healthy"`
	Replicas int         `json:"replicas"`
	Runs     []StarveRun `json:"runs"`
}

// StarveRun is one build's replicas on a fresh copy of the stage's
// backlog.
type StarveRun struct {
	WorkerBuild
	// Healthy is the distinct healthy events received within the
	// -starve-timeout; Seconds runs from the replicas' start to the last
	// one's receipt (or to the deadline), FirstSeconds to the first.
	Healthy      int     `json:"healthyDelivered"`
	AllHealthy   bool    `json:"allHealthyDelivered"`
	Seconds      float64 `json:"seconds"`
	FirstSeconds float64 `json:"firstHealthySeconds"`
	// Cycles are each replica's claim cycles (claim runs that read the
	// outbox: claimed or found nothing) until then; Published each
	// replica's healthy events marked PUBLISHED by it.
	Cycles    []int   `json:"claimCyclesByReplica"`
	Published []int64 `json:"healthyPublishedByReplica"`
	// HeadDelivered is the head's events received during the healthy
	// phase (the paused type still paused); HeadChanged the held
	// events no longer in the status they were inserted with.
	HeadDelivered int `json:"headDelivered"`
	HeadChanged   int `json:"headChanged"`
	// Drain is the paused events relayed after the resume by a fresh set
	// of replicas, from their start to the last arrival; nil for held.
	Drain *Rate  `json:"drainAfterResume,omitempty"`
	Error string `json:"error,omitempty"`
}

// starveFig is the starvation stages' figures, one per stage.
var starveFig = figure[[]Starvation]{"starvation"}

// starvationStage is the opt-in starvation stage called key:
// "paused-head" or "held-head".
func starvationStage(key string) stage {
	return stage{
		key: key, optIn: true, figures: []anyFigure{starveFig},
		steps:   one(key, func(b *bench, ctx context.Context) error { return b.starvation(ctx, key) }),
		rows:    func(r *Results, add addRow) { starveRows(r, key, add) },
		targets: func(r *Results, add addTarget) { starveTargets(r, key, add) },
	}
}

// starveShape is what differs between the two stages.
type starveShape struct {
	name     string
	head     int // paused events, or held aggregates
	headDocs int
	doc      func(i int, base time.Time) (bson.D, error)
	paused   bool
}

func (b *bench) starveShape(key string) starveShape {
	if key == "paused-head" {
		n := b.cfg.PausedHead
		return starveShape{
			name: fmt.Sprintf("%s NEW events of a paused type at the head", thousands(n)), head: n, headDocs: n, paused: true,
			doc: func(i int, base time.Time) (bson.D, error) {
				return events.Draft{
					ID: fmt.Sprintf("%s%06d", starvePausedIDs, i), Type: starvePausedType, AggregateType: "paused",
					AggregateID: fmt.Sprintf("paused-%04d", i%starvePausedAggs), Payload: benchorder.Payload(i),
				}.Document(base.Add(time.Duration(i) * time.Millisecond))
			},
		}
	}
	n := b.cfg.HeldHead
	return starveShape{
		name: fmt.Sprintf("%s aggregates held by FAILED events at the head, %d NEW waiting each", thousands(n), starveHeldWaiting),
		head: n, headDocs: n * (1 + starveHeldWaiting),
		doc: func(i int, base time.Time) (bson.D, error) {
			return heldDocOf(i, starveHeldWaiting, base)
		},
	}
}

// starvation runs the stage called key with each build.
func (b *bench) starvation(ctx context.Context, key string) error {
	sh := b.starveShape(key)
	fmt.Fprintf(b.out, "   %s, %d healthy events behind, one to an aggregate; %d replicas at their defaults\n", sh.name, b.cfg.StarveHealthy, starveReplicas)
	st := Starvation{Key: key, Name: sh.name, Head: sh.head, HeadDocs: sh.headDocs, Healthy: b.cfg.StarveHealthy, Replicas: starveReplicas}
	for _, bin := range b.workerBinaries() {
		run, err := b.starveRun(ctx, key, sh, bin)
		if err != nil {
			return err
		}
		st.Runs = append(st.Runs, run)
		fmt.Fprintf(b.out, "   %s: %s\n", run.Build, run.describe(st))
	}
	starveFig.set(b.res, append(starveFig.value(b.res), st))
	return nil
}

// starveRun is one build's run: the healthy phase, and for a paused head
// the drain after the resume.
func (b *bench) starveRun(ctx context.Context, key string, sh starveShape, bin WorkerBuild) (StarveRun, error) {
	label := strings.ReplaceAll(bin.Build, " ", "_")
	coll, store, err := b.preparedCollection(ctx, "starve_"+strings.ReplaceAll(key, "-", "_")+"_"+label)
	if err != nil {
		return StarveRun{}, err
	}
	readings := &tableReadings{b: b}
	defer readings.drop()
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	healthy := b.cfg.StarveHealthy
	if _, err := insertEvents(ctx, coll, sh.headDocs+healthy, 0, func(i int, _ time.Time) (bson.D, error) {
		if i < sh.headDocs {
			return sh.doc(i, base)
		}
		return healthyDocOf(i-sh.headDocs, 1, base.Add(30*time.Minute))
	}); err != nil {
		dropQuietly(coll)
		return StarveRun{}, err
	}
	if sh.paused {
		if _, err := store.Pause(ctx, events.Pause{Type: starvePausedType, By: "bench", Reason: "starvation stage", At: time.Now()}); err != nil {
			dropQuietly(coll)
			return StarveRun{}, err
		}
	}
	exchange := uniqueName("bench-" + key + "-" + label)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		dropQuietly(coll)
		return StarveRun{}, err
	}
	defer cons.close()

	tr := readings.start(ctx, coll, key, fmt.Sprintf("%d replicas (%s), until the healthy events were out", starveReplicas, bin.Build), sh.headDocs+healthy)
	run := StarveRun{WorkerBuild: bin}
	claims, err := b.starveHealthyPhase(ctx, key, coll.Name(), exchange, bin, cons, &run)
	if err != nil {
		return StarveRun{}, err
	}
	tr.end(run.Healthy, claims)
	if err := readings.finish(ctx); err != nil {
		return StarveRun{}, err
	}
	if run.Published, err = healthyByWorker(ctx, coll, key, label); err != nil {
		return StarveRun{}, err
	}
	if !sh.paused {
		unchanged, err := heldUnchanged(ctx, coll)
		if err != nil {
			return StarveRun{}, err
		}
		run.HeadChanged = sh.headDocs - unchanged
		return run, nil
	}
	if _, err := store.Resume(ctx, starvePausedType); err != nil {
		return StarveRun{}, err
	}
	run.Drain, err = b.starveDrain(ctx, key+"-drain", coll.Name(), exchange, bin, cons, sh.head)
	return run, err
}

// starveHealthyPhase starts the replicas, waits for the healthy events
// up to -starve-timeout, notes what the replicas did and stops them. It
// returns their claim cycles in all.
func (b *bench) starveHealthyPhase(ctx context.Context, key, collection, exchange string, bin WorkerBuild, cons *consumer, run *StarveRun) (int, error) {
	start := time.Now()
	workers, err := b.startReplicas(key, collection, exchange, bin)
	defer killAll(workers)
	if err != nil {
		return 0, err
	}
	if err := cons.waitForPrefix(ctx, healthyIDPrefix, b.cfg.StarveHealthy, b.cfg.StarveTimeout); err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		run.Error = err.Error()
	}
	arrived, _, _ := cons.Snapshot()
	ms, err := settledMetrics(ctx, workers, arrived)
	if err != nil {
		return 0, err
	}
	claims := 0
	for _, m := range ms {
		run.Cycles = append(run.Cycles, m.readClaims())
		claims += m.readClaims()
	}
	if err := stopAll(workers); err != nil {
		run.Error = strings.TrimPrefix(run.Error+"; "+err.Error(), "; ")
	}
	var healthyAt []time.Time
	for id, at := range cons.FirstArrivals() {
		switch {
		case strings.HasPrefix(id, healthyIDPrefix):
			healthyAt = append(healthyAt, at)
		case strings.HasPrefix(id, starvePausedIDs), strings.HasPrefix(id, heldIDPrefix):
			run.HeadDelivered++
		}
	}
	run.Healthy = len(healthyAt)
	run.AllHealthy = run.Healthy == b.cfg.StarveHealthy
	end := time.Now()
	if run.AllHealthy {
		end = slices.MaxFunc(healthyAt, time.Time.Compare)
	}
	run.Seconds = round(end.Sub(start).Seconds(), 2)
	if len(healthyAt) > 0 {
		run.FirstSeconds = round(slices.MinFunc(healthyAt, time.Time.Compare).Sub(start).Seconds(), 2)
	}
	return claims, nil
}

// starveDrain starts a fresh set of replicas after the resume and times
// the paused events' drain: from the replicas' start to the last paused
// event's arrival.
func (b *bench) starveDrain(ctx context.Context, key, collection, exchange string, bin WorkerBuild, cons *consumer, n int) (*Rate, error) {
	start := time.Now()
	workers, err := b.startReplicas(key, collection, exchange, bin)
	defer killAll(workers)
	if err != nil {
		return nil, err
	}
	waitErr := cons.waitForPrefix(ctx, starvePausedIDs, n, starveDrainDeadline)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	stopErr := stopAll(workers)
	var last time.Time
	got := 0
	for id, at := range cons.FirstArrivals() {
		if strings.HasPrefix(id, starvePausedIDs) {
			got++
			if at.After(last) {
				last = at
			}
		}
	}
	if got == 0 {
		return &Rate{}, errors.Join(waitErr, stopErr)
	}
	if waitErr != nil || stopErr != nil {
		fmt.Fprintf(b.out, "   drain after the resume (%s): %v\n", bin.Build, errors.Join(waitErr, stopErr))
	}
	r := rateOf(got, last.Sub(start))
	return &r, nil
}

// startReplicas starts starveReplicas workers of bin at their defaults;
// on an error it returns those it started, for the caller to kill.
func (b *bench) startReplicas(key, collection, exchange string, bin WorkerBuild) ([]*workerProc, error) {
	var workers []*workerProc
	for i := range starveReplicas {
		w, err := b.startWorker(workerOpts{
			id:  fmt.Sprintf("bench-%s-%s-%d", key, strings.ReplaceAll(bin.Build, " ", "-"), i+1),
			bin: bin.Binary, collection: collection, exchange: exchange, defaults: true,
		})
		if err != nil {
			return workers, err
		}
		workers = append(workers, w)
	}
	return workers, nil
}

func killAll(workers []*workerProc) {
	for _, w := range workers {
		w.Kill()
	}
}

// stopAll stops every worker with SIGTERM, one after the other.
func stopAll(workers []*workerProc) error {
	var errs []error
	for _, w := range workers {
		_, err := w.stop(stopTimeout)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// healthyByWorker counts, for each replica of the run, the healthy
// events it marked PUBLISHED (an equality filter, which FerretDB pushes
// down).
func healthyByWorker(ctx context.Context, coll *driver.Collection, key, label string) ([]int64, error) {
	out := make([]int64, starveReplicas)
	for i := range out {
		id := fmt.Sprintf("bench-%s-%s-%d", key, strings.ReplaceAll(label, "_", "-"), i+1)
		n, err := coll.CountDocuments(ctx, bson.D{
			{Key: events.FieldStatus, Value: events.StatusPublished},
			{Key: events.FieldAggregateType, Value: "order"},
			{Key: events.FieldWorkerID, Value: id},
		})
		if err != nil {
			return nil, fmt.Errorf("count the healthy events %s published: %w", id, err)
		}
		out[i] = n
	}
	return out, nil
}

// describe is the run's figures in one line.
func (r StarveRun) describe(st Starvation) string {
	s := fmt.Sprintf("%s of %s healthy events in %.1f s (first after %.1f s); claim cycles by replica %v, healthy events published by replica %v; %s head events delivered",
		thousands(r.Healthy), thousands(st.Healthy), r.Seconds, r.FirstSeconds, r.Cycles, r.Published, thousands(r.HeadDelivered))
	if st.Key == "held-head" {
		s += fmt.Sprintf(", %s changed", thousands(r.HeadChanged))
	} else {
		s += " while paused"
	}
	if r.Drain != nil {
		s += fmt.Sprintf("; after the resume %s", r.Drain.describe("paused events"))
	}
	return s + prefixed("; ", r.Error)
}

// starveRows adds the rows of the starvation stage called key.
func starveRows(r *Results, key string, add addRow) {
	for _, st := range starveFig.value(r) {
		if st.Key != key {
			continue
		}
		for _, run := range st.Runs {
			target := ""
			if run.isCurrent() {
				target = targetStarveHealthy(st)
			}
			add(fmt.Sprintf("Starvation: %s healthy events behind %s, %d replicas at their defaults (%s)", thousands(st.Healthy), st.Name, st.Replicas, run.Build),
				run.describe(st), target)
		}
		if run, ok := currentOf(st.Runs); ok {
			add(fmt.Sprintf("Starvation, %s: no head event delivered (this build)", st.Name), fmt.Sprintf("%d delivered, %d changed", run.HeadDelivered, run.HeadChanged), targetStarveHead(st))
		}
	}
}

func targetStarveHealthy(st Starvation) string {
	return "starvation, " + st.Key + ": every healthy event delivered"
}
func targetStarveHead(st Starvation) string {
	return "starvation, " + st.Key + ": no head event delivered"
}

// starveTargets: this build delivered every healthy event within
// -starve-timeout and none of the head.
func starveTargets(r *Results, key string, add addTarget) {
	for _, st := range starveFig.value(r) {
		run, ok := currentOf(st.Runs)
		if st.Key != key || !ok {
			continue
		}
		add(targetStarveHealthy(st), fmt.Sprintf("all %s", thousands(st.Healthy)), fmt.Sprintf("%s of %s", thousands(run.Healthy), thousands(st.Healthy)), run.AllHealthy)
		add(targetStarveHead(st), "0 delivered, 0 changed", fmt.Sprintf("%d delivered, %d changed", run.HeadDelivered, run.HeadChanged),
			run.HeadDelivered == 0 && run.HeadChanged == 0)
	}
}
