package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// backingOff is how many events wait for a retry at the head of the
// collection in the second half of the claim-backoff stage.
const backingOff = 10000

// backoffType marks the backing-off events, which no claim may take.
const backoffType = "bench.backing-off"

// claimBackoff times mongo.Store.Claim of one batch on ClaimNew NEW events,
// first alone, then with 10,000 NEW events backing off (retryAt an hour
// ahead) that are older than all of them: the head of the claim's order,
// which a claim must step over without reading them all each time. It
// also counts the claim's database commands and, where the server reports
// it (MongoDB's serverStatus), the documents it examined.
func (b *bench) claimBackoff(ctx context.Context) error {
	coll, err := b.collection(ctx, "claim_backoff")
	if err != nil {
		return err
	}
	defer dropQuietly(coll)
	var commands atomic.Int64
	client, err := driver.Connect(options.Client().ApplyURI(b.mongoURI).SetMaxPoolSize(4).SetAppName("outbox-bench-claim").
		SetMonitor(&event.CommandMonitor{Started: func(context.Context, *event.CommandStartedEvent) { commands.Add(1) }}))
	if err != nil {
		return err
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()
	store := b.store(client, coll)
	if err := store.Prepare(ctx); err != nil {
		return err
	}
	if _, err := insertEvents(ctx, coll, b.cfg.ClaimNew, 0, eventDoc); err != nil {
		return err
	}
	c := ClaimBackoff{New: b.cfg.ClaimNew, BatchSize: b.cfg.BatchSize, BackingOff: backingOff}
	claims := func() (ClaimCost, error) { return b.claimCost(ctx, store, coll, &commands) }
	if c.Without, err = claims(); err != nil {
		return err
	}
	head := time.Now().Add(-24 * time.Hour)
	retryAt := time.Now().Add(time.Hour).UTC()
	if _, err := insertEvents(ctx, coll, backingOff, 0, func(i int, _ time.Time) (bson.D, error) {
		doc, err := eventDoc(i, head.Add(time.Duration(i)*time.Millisecond))
		if err != nil {
			return nil, err
		}
		for j := range doc {
			if doc[j].Key == events.FieldType {
				doc[j].Value = backoffType
			}
		}
		return append(doc, bson.E{Key: events.FieldRetryAt, Value: retryAt}, bson.E{Key: events.FieldAttempts, Value: 1}), nil
	}); err != nil {
		return err
	}
	if c.With, err = claims(); err != nil {
		return err
	}
	if c.Without.MedianMs > 0 {
		c.Ratio = round(c.With.MedianMs/c.Without.MedianMs, 2)
	}
	claimBackoffFig.set(b.res, c)
	for _, x := range []struct {
		name string
		cost ClaimCost
	}{{"no backing-off events", c.Without}, {fmt.Sprintf("%d backing off at the head", backingOff), c.With}} {
		fmt.Fprintf(b.out, "   claim of %d on %d NEW, %s: median %.0f ms %v, %.1f commands per claim, docs examined %s\n",
			c.BatchSize, c.New, x.name, x.cost.MedianMs, x.cost.RunsMs, x.cost.Commands, examined(x.cost.DocsExamined))
	}
	return nil
}

// claimCost times ClaimRuns claims, putting each batch back to NEW before
// the next; it counts the claim's commands and, where serverStatus has
// them, the documents the server examined during each claim.
func (b *bench) claimCost(ctx context.Context, store *mongo.Store, coll *driver.Collection, commands *atomic.Int64) (ClaimCost, error) {
	var c ClaimCost
	var cmds, docs float64
	docsKnown := true
	for i := range b.cfg.ClaimRuns {
		lease := events.Lease{
			WorkerID: "bench-backoff",
			Token:    fmt.Sprintf("backoff-%d-%d", time.Now().UnixNano(), i),
			At:       time.Now().UTC().Truncate(time.Millisecond),
		}
		scanned0, ok0 := b.scannedObjects(ctx)
		n0 := commands.Load()
		t0 := time.Now()
		res, err := store.Claim(ctx, lease, events.ClaimLimit{Events: b.cfg.BatchSize})
		claimed := res.Claimed
		d := time.Since(t0)
		cmds += float64(commands.Load() - n0)
		scanned1, ok1 := b.scannedObjects(ctx)
		docsKnown = docsKnown && ok0 && ok1
		docs += float64(scanned1 - scanned0)
		if err != nil {
			return c, err
		}
		if len(claimed) != b.cfg.BatchSize {
			return c, fmt.Errorf("claimed %d events, want %d", len(claimed), b.cfg.BatchSize)
		}
		for _, e := range claimed {
			if e.Doc.Lookup(events.FieldType).StringValue() == backoffType {
				return c, fmt.Errorf("the claim took event %v, which backs off for another hour", e.ID)
			}
		}
		c.RunsMs = append(c.RunsMs, round(float64(d)/float64(time.Millisecond), 1))
		if _, err := store.Abandon(ctx, lease); err != nil { // back to NEW for the next run
			return c, err
		}
	}
	runs := float64(len(c.RunsMs))
	c.MedianMs = median(c.RunsMs)
	c.Commands = round(cmds/runs, 1)
	c.DocsExamined = -1
	if docsKnown {
		c.DocsExamined = round(docs/runs, 0)
	}
	return c, nil
}

// scannedObjects is MongoDB's count of documents examined by queries since
// it started (serverStatus metrics.queryExecutor.scannedObjects); false
// where the server does not report it (FerretDB).
func (b *bench) scannedObjects(ctx context.Context) (int64, bool) {
	raw, err := b.client.Database("admin").RunCommand(ctx, bson.D{{Key: "serverStatus", Value: 1}}).Raw()
	if err != nil {
		return 0, false
	}
	v, err := raw.LookupErr("metrics", "queryExecutor", "scannedObjects")
	if err != nil {
		return 0, false
	}
	n, ok := v.AsInt64OK()
	return n, ok
}

// examined prints a docs-examined figure, -1 meaning unknown.
func examined(n float64) string {
	if n < 0 {
		return "not reported by this server"
	}
	return fmt.Sprintf("%.0f per claim", n)
}

// claimBackoffFig is the claim's cost with and without events backing off.
var claimBackoffFig = figure[ClaimBackoff]{"claimBackoff"}

var claimBackoffStage = stage{
	key: "claim-backoff", figures: []anyFigure{claimBackoffFig},
	steps: one("claim latency with events backing off", (*bench).claimBackoff), rows: claimBackoffRows,
}

func claimBackoffRows(r *Results, add addRow) {
	cb, ok := claimBackoffFig.get(r)
	if !ok {
		return
	}
	for i, x := range []struct {
		name string
		cost ClaimCost
	}{{"no events backing off", cb.Without}, {fmt.Sprintf("%s NEW events backing off (retryAt +1 h) at the head", thousands(cb.BackingOff)), cb.With}} {
		result := fmt.Sprintf("median %.0f ms of %d, %.1f commands per claim, docs examined %s",
			x.cost.MedianMs, len(x.cost.RunsMs), x.cost.Commands, examined(x.cost.DocsExamined))
		if i == 1 && cb.Ratio > 0 {
			result += fmt.Sprintf(", %.2fx", cb.Ratio)
		}
		add(fmt.Sprintf("Claim latency, store.Claim of %d on %s NEW, %s", cb.BatchSize, thousands(cb.New), x.name), result, "")
	}
}
