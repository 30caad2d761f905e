package events_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// A producer writes its business document and the event announcing it in
// one transaction: both commit, or neither does. Transactions need a replica
// set or a sharded cluster.
func ExampleInsert() {
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://localhost:27017/?replicaSet=rs0"))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Disconnect(ctx) }()

	db := client.Database("shop")
	orders := db.Collection("orders")
	outbox := db.Collection("events")

	sess, err := client.StartSession()
	if err != nil {
		log.Panic(err) // unlike log.Fatal, lets the deferred calls run
	}
	defer sess.EndSession(ctx)

	order := bson.D{{Key: "_id", Value: "o-1001"}, {Key: "total", Value: int64(4200)}}
	// WithTransaction retries the callback on transient errors, so the
	// callback must do nothing but database work. It must use the ctx it is
	// given: that ctx carries the session, and with it the transaction.
	eventID, err := sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		if _, err := orders.InsertOne(ctx, order); err != nil {
			return nil, fmt.Errorf("insert order: %w", err)
		}
		return events.Insert(ctx, outbox, events.Draft{
			// A stable business key as the event ID lets consumers
			// deduplicate redeliveries.
			ID:            "order-o-1001-created",
			Type:          "order.created",
			AggregateType: "order",
			AggregateID:   "o-1001",
			Payload:       order,
			Headers:       map[string]any{"tenant": "acme"},
		})
	})
	if err != nil {
		log.Panic(err) // unlike log.Fatal, lets the deferred calls run
	}
	fmt.Println("wrote event", eventID)
}

// Draft.Document is the NEW event document that Insert writes, checked
// against the contract first, so a producer can write it with any driver
// call of its own (an InsertMany of several events, a bulk write).
func ExampleDraft_Document() {
	doc, err := events.Draft{
		ID:            "order-o-1001-created",
		Type:          "order.created",
		AggregateType: "order",
		AggregateID:   "o-1001",
		Payload:       bson.D{{Key: "total", Value: int64(4200)}},
	}.Document(time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC))
	if err != nil {
		log.Panic(err) // unlike log.Fatal, lets the deferred calls run
	}
	for _, e := range doc {
		fmt.Printf("%s: %v\n", e.Key, e.Value)
	}

	_, err = events.Draft{Type: "order.created"}.Document(time.Now())
	fmt.Println(err)
	// Output:
	// _id: order-o-1001-created
	// type: order.created
	// payload: {"total": {"$numberLong":"4200"}}
	// status: NEW
	// createdAt: 2026-11-22 09:30:00 +0000 UTC
	// aggregateType: order
	// aggregateId: o-1001
	// partition: 11
	// invalid event draft: payload is missing
}

// Without OUTBOX_CLOUDEVENTS_SOURCE, a CloudEvents message's source names
// the outbox it came from, each name escaped as a path segment.
func ExampleDefaultCloudEventsSource() {
	fmt.Println(events.DefaultCloudEventsSource("outbox", "events"))
	fmt.Println(events.DefaultCloudEventsSource("my db", "events"))
	fmt.Println(events.DefaultCloudEventsSource("ürün/x?y", "events"))
	// Output:
	// /outbox/outbox/events
	// /outbox/my%20db/events
	// /outbox/%C3%BCr%C3%BCn%2Fx%3Fy/events
}
