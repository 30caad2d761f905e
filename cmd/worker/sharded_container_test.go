package main

// The relay through a mongos router: three workers relay a backlog from
// an outbox collection sharded on {partition: 1, aggregateId: 1}, its
// partitions split over two shards (docs/scaling.md), with the fenced
// claims, the PUBLISHED writes and the ownership collections of a
// replica set. Started with testcontainers-go: a config server, two
// shards, mongos and RabbitMQ. It needs a Docker engine and skips, saying
// so, where there is none. Claims are atomic on MongoDB: any duplicate
// delivery fails it.

import (
	"context"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

func TestContainersSharded(t *testing.T) {
	t.Parallel()
	cluster := testenv.ShardedCluster(t)
	s := stack{name: "mongodb-sharded", mongoURI: cluster.URI, amqpURL: testenv.RabbitMQ(t), atomicClaims: true}
	const n = e2eEventsDefault
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db, coll, exchange, r := s.relayed(t)
	key := bson.D{{Key: events.FieldPartition, Value: 1}, {Key: events.FieldAggregateID, Value: 1}}
	middle := bson.D{{Key: events.FieldPartition, Value: int32(events.Partitions / 2)}, {Key: events.FieldAggregateID, Value: bson.MinKey{}}}
	first, second := cluster.ShardTwoWays(t, db.Name()+"."+coll.Name(), key, middle)
	t.Logf("partitions below %d on %s, the rest on %s", events.Partitions/2, first, second)

	// As the producer helper writes them: with their partition, so that
	// each lands in its partition's chunk.
	ids := insertBacklog(ctx, t, coll, n, "e2e.sharded")
	procs := make([]*workerproc.Proc, 3)
	for i := range procs {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		procs[i] = startWorker(t, id, s.relayEnv(db.Name(), exchange, id))
	}
	explained(t, coll, func() { r.waitDistinct(ctx, t, n) })
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	stopWorkers(t, procs...)
	r.drain(t)

	r.checkExactly(t, ids)
	checkEveryWorkerPublished(ctx, t, coll, procs)
	if distinct, total, _ := r.Snapshot(); total != distinct {
		t.Errorf("%d duplicate deliveries through mongos, want none: claims must be atomic", total-distinct)
	}
}
