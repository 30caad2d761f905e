package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// fleetWakeupScenario: three outboxes, two in one database and one in
// another, on a claim schedule that never ticks in the test's time: an
// event written to each, after the outboxes have idled, is delivered,
// which only the change stream of its database can have woken it for.
// Each database's stream wakes the outbox an insert names, not only the
// first or all of them. It logs each event's wait, the first-event wait
// of a long-idle outbox with change streams (FLEET-WAKEUP-FIGURES).
func fleetWakeupScenario(t *testing.T, s stack) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	client := s.connect(t, testenv.ClientMaxPoolSize)
	shared, other := uniqueDatabase(t, client), uniqueDatabase(t, client)
	colls := []*driver.Collection{shared.Collection("a_outbox"), shared.Collection("b_outbox"), other.Collection("c_outbox")}
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, s.amqpURL, exchange)
	var file strings.Builder
	file.WriteString("outboxes:\n")
	for i, c := range colls {
		fmt.Fprintf(&file, "  - name: box-%d\n    database: %s\n    collection: %s\n    exchange: %s\n", i, c.Database().Name(), c.Name(), exchange)
	}
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	env := s.workerEnv(shared.Name(), exchange, shared.Name()+"-fleet-wakeup")
	env["OUTBOX_FLEET_FILE"] = path
	env["OUTBOX_CLAIM_SCHEDULE"] = "@every 1h"
	p := startWorker(t, "fleet-wakeup", env)
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		if httpAddr(t, p) == "" {
			return false, "the worker has not started"
		}
		var status struct {
			Outboxes []struct {
				Outbox string `json:"outbox"`
				WakeUp string `json:"wakeUp"`
			} `json:"outboxes"`
		}
		getStatus(ctx, t, p, &status)
		open := 0
		for _, o := range status.Outboxes {
			if o.WakeUp == "change stream" {
				open++
			}
		}
		return open == len(colls), fmt.Sprintf("%d of %d outboxes woken by a change stream: %+v", open, len(colls), status.Outboxes)
	})
	// Idle a while: the claims that ran at start (partitions taken) have
	// found nothing, and the schedule will not tick again.
	time.Sleep(3 * time.Second) // the idle the figure is after, not a wait for the worker
	for i, c := range colls {
		id := bson.NewObjectID()
		written := time.Now()
		if _, err := c.InsertOne(ctx, bson.D{
			{Key: events.FieldID, Value: id}, {Key: events.FieldType, Value: "e2e.fleet-wakeup"},
			{Key: events.FieldPayload, Value: bson.D{{Key: "n", Value: int32(i)}}},
			{Key: events.FieldStatus, Value: events.StatusNew}, {Key: events.FieldCreatedAt, Value: written.UTC()},
		}); err != nil {
			t.Fatal(err)
		}
		got := testenv.Receive(t, deliveries, []string{id.Hex()}, timeLeft(ctx))
		if got[id.Hex()] == 0 {
			t.Fatalf("the event of %s.%s was not delivered", c.Database().Name(), c.Name())
		}
		t.Logf("FLEET-WAKEUP-FIGURES: outbox box-%d (database %s): first event after idle delivered %s after its insert",
			i, c.Database().Name(), time.Since(written).Round(time.Millisecond))
	}
	stopWorkers(t, p)
}
