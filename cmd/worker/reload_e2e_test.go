package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// TestE2EFleetReload: two replicas relay outboxes a and b; one of them is
// given a file of b (changed) and c and a SIGHUP. Without a restart it
// stops relaying a and gives a's partitions back (the other replica
// relays all of a's later events), starts relaying c, and restarts b with
// its new settings; a file that does not load is refused and changes
// nothing.
func TestE2EFleetReload(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	const n = 100
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(6*n)+time.Minute)
	defer cancel()
	client := s.connect(t, testenv.ClientMaxPoolSize)
	shared, other := uniqueDatabase(t, client), uniqueDatabase(t, client)
	a := &fleetOutbox{name: "a", db: shared, collection: "a_events"}
	b := &fleetOutbox{name: "b", db: shared, collection: "b_events"}
	c := &fleetOutbox{name: "c", db: other, collection: "events"}
	entry := map[*fleetOutbox]string{}
	for _, o := range []*fleetOutbox{a, b, c} {
		o.coll = o.db.Collection(o.collection)
		o.exchange = testenv.UniqueName(t, "ex_"+o.name+"_")
		o.r = consumeOrdered(t, s, o.exchange, "#")
		entry[o] = fmt.Sprintf("  - name: %s\n    database: %s\n    collection: %s\n    exchange: %s\n", o.name, o.db.Name(), o.collection, o.exchange)
	}
	dir := t.TempDir()
	write := func(name string, outboxes ...*fleetOutbox) string {
		text := "outboxes:\n"
		for _, o := range outboxes {
			text += entry[o]
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	for _, o := range []*fleetOutbox{a, b, c} {
		o.insert(ctx, t, base, n)
	}

	ids := []string{shared.Name() + "-w0", shared.Name() + "-w1"}
	paths := []string{write("w0.yaml", a, b), write("w1.yaml", a, b)}
	var procs []*workerproc.Proc
	for i, id := range ids {
		env := s.workerEnv(shared.Name(), "unused", id)
		env["OUTBOX_FLEET_FILE"] = paths[i]
		env["OUTBOX_LOG_LEVEL"] = "info"
		procs = append(procs, startWorker(t, id, env))
	}
	a.r.waitDistinct(ctx, t, n)
	b.r.waitDistinct(ctx, t, n)
	if got := c.r.distinct(); got != 0 {
		t.Fatalf("%d events of c arrived before any worker relayed c", got)
	}

	// b changes (a batch size of its own): it restarts with it.
	entry[b] += "    batch_size: 50\n"
	write("w0.yaml", b, c)
	if err := procs[0].Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		log := readLog(t, procs[0])
		return strings.Contains(log, `"msg":"outboxes reloaded","worker_id":"`+ids[0]+`","added":["c"],"removed":["a"],"changed":["b"]`),
			"no reload that adds c, removes a and changes b in w0's log yet"
	})
	c.r.waitDistinct(ctx, t, n)
	// A file that does not load changes nothing.
	if err := os.WriteFile(filepath.Join(dir, "w0.yaml"), []byte("outboxes:\n  - name: B\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := procs[0].Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		return strings.Contains(readLog(t, procs[0]), `"msg":"reload refused: the outboxes relay as before"`), "no refused reload in w0's log yet"
	})
	// w0 let a go: its heartbeat is gone from a's owners, and every later
	// event of a is published by w1.
	if hb, err := a.db.Collection(a.collection+"_owners").CountDocuments(ctx, bson.D{{Key: events.FieldWorkerID, Value: ids[0]}}); err != nil || hb != 0 {
		t.Errorf("a_events_owners holds %d heartbeats of w0 after it let a go (error %v), want none", hb, err)
	}
	later := &fleetOutbox{name: "a", db: a.db, coll: a.coll, r: a.r}
	later.insert(ctx, t, base.Add(time.Minute), n)
	bLater := &fleetOutbox{name: "b", db: b.db, coll: b.coll, r: b.r}
	bLater.insert(ctx, t, base.Add(time.Minute), n)
	a.r.waitDistinct(ctx, t, 2*n)
	b.r.waitDistinct(ctx, t, 2*n)
	for _, id := range later.ids {
		var doc struct {
			WorkerID string `bson:"workerId"`
		}
		oid, err := bson.ObjectIDFromHex(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: oid}}).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if doc.WorkerID != ids[1] {
			t.Errorf("event %s of a, inserted after w0 let a go, was published by %q, want w1", id, doc.WorkerID)
			break
		}
	}
	var status struct {
		Outboxes []struct {
			Outbox string `json:"outbox"`
		} `json:"outboxes"`
	}
	getStatus(ctx, t, procs[0], &status)
	var names []string
	for _, o := range status.Outboxes {
		names = append(names, o.Outbox)
	}
	if strings.Join(names, ",") != "b,c" {
		t.Errorf("w0's /status lists outboxes %v after the reload, want b, c", names)
	}
	stopWorkers(t, procs...)
	a.ids, a.byAggregate = append(a.ids, later.ids...), nil
	b.ids, b.byAggregate = append(b.ids, bLater.ids...), nil
	for _, o := range []*fleetOutbox{a, b, c} {
		o.r.drain(t)
		o.check(t)
	}
}
