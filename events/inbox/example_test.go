package inbox_test

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events/inbox"
)

// New validates the configuration and names the setting at fault; it does
// no I/O, so this runs without servers.
func ExampleNew() {
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:27017"))
	if err != nil {
		panic(err)
	}
	defer client.Disconnect(context.Background()) //nolint:errcheck // nothing was sent

	orders := client.Database("shop").Collection("orders")
	handle := func(ctx context.Context, d amqp.Delivery) error {
		_, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: d.MessageId}, {Key: "body", Value: string(d.Body)}})
		return err
	}

	_, err = inbox.New(client, handle, inbox.Config{Database: "shop", Retention: 10 * time.Minute})
	fmt.Println(err)
	in, err := inbox.New(client, handle, inbox.Config{Database: "shop", Metrics: inbox.Metrics{Processed: func() { /* count it */ }}})
	fmt.Println(in != nil, err)
	// Output:
	// inbox: Retention 10m0s: want at least 1h0m0s, and more than the longest redelivery window
	// true <nil>
}

// A consumer's whole use of the inbox: its handler writes through ctx,
// which carries the transaction where the server has them.
func Example_consumer() {
	ctx := context.Background()
	client, _ := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:27017/?replicaSet=rs0"))
	conn, _ := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	ch, _ := conn.Channel()
	_ = ch.Qos(100, 0, false)
	deliveries, _ := ch.Consume("orders", "", false, false, false, false, nil) // manual acks

	payments := client.Database("shop").Collection("payments")
	in, err := inbox.New(client, func(ctx context.Context, d amqp.Delivery) error {
		_, err := payments.InsertOne(ctx, bson.D{{Key: "order", Value: d.Headers["x-aggregate-id"]}})
		return err
	}, inbox.Config{Database: "shop"})
	if err != nil {
		panic(err)
	}
	if err := in.Start(ctx); err != nil {
		panic(err)
	}
	defer in.Stop(ctx) //nolint:errcheck // shutting down
	_ = in.Run(ctx, deliveries)
}
