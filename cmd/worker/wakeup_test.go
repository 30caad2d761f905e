package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// wakeupScenario (real MongoDB, a replica set): a worker on the default
// claim schedule (@every 1s) relays events written one at a time, and the
// change stream's wake-up keeps the 99th percentile of insert-to-delivery
// latency well under the schedule's period. Without it the latency would
// spread evenly over the period (p99 near 1 s).
func wakeupScenario(t *testing.T, s stack) {
	const (
		n      = 60
		spread = 137 * time.Millisecond // not a divisor of the period
		period = time.Second            // claim.ScheduleDefault
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	deliveries := testenv.Consume(t, s.amqpURL, exchange)

	var (
		mu       sync.Mutex
		received = map[string]time.Time{}
	)
	go func() {
		for d := range deliveries {
			mu.Lock()
			if _, ok := received[d.MessageId]; !ok {
				received[d.MessageId] = time.Now()
			}
			mu.Unlock()
		}
	}()

	env := s.workerEnv(db.Name(), exchange, db.Name()+"-wakeup")
	delete(env, "OUTBOX_CLAIM_SCHEDULE") // the default, @every 1s
	env["OUTBOX_LOG_LEVEL"] = "info"
	p := startWorker(t, "wakeup", env)
	var status struct {
		WakeUp string `json:"wakeUp"`
	}
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		if httpAddr(t, p) == "" {
			return false, "the worker has not started"
		}
		getStatus(ctx, t, p, &status)
		return status.WakeUp == "change stream", fmt.Sprintf("the change stream did not open (wakeUp %q)", status.WakeUp)
	})

	inserted := map[string]time.Time{}
	tick := time.NewTicker(spread)
	defer tick.Stop()
	for i := range n {
		id := bson.NewObjectID()
		inserted[id.Hex()] = time.Now()
		if _, err := coll.InsertOne(ctx, bson.D{
			{Key: events.FieldID, Value: id}, {Key: events.FieldType, Value: "e2e.wakeup"},
			{Key: events.FieldPayload, Value: bson.D{{Key: "n", Value: int32(i)}}},
			{Key: events.FieldStatus, Value: events.StatusNew}, {Key: events.FieldCreatedAt, Value: time.Now().UTC()},
		}); err != nil {
			t.Fatal(err)
		}
		<-tick.C // the producer's pace, not a wait for the worker
	}
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(received) >= n, fmt.Sprintf("%d of %d events delivered", len(received), n)
	})
	stopWorkers(t, p)

	mu.Lock()
	lat := make([]time.Duration, 0, n)
	for id, at := range inserted {
		lat = append(lat, received[id].Sub(at))
	}
	mu.Unlock()
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("WAKEUP-FIGURES: %d events one every %s, schedule @every %s: p50 %s, p99 %s, max %s",
		n, spread, period, p50.Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	fmt.Printf("WAKEUP-FIGURES: events=%d p50_ms=%d p99_ms=%d\n", n, p50.Milliseconds(), p99.Milliseconds())
	if p99 >= period/2 {
		t.Errorf("p99 insert-to-delivery latency %s with the wake-up, want well under the schedule's period %s", p99, period)
	}
}
