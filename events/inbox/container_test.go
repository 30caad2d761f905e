package inbox

// The container suite: the transactional path on a real MongoDB (a
// single-node replica set, so that transactions exist), which the relay's
// container suite starts with testcontainers-go and names in
// OUTBOX_TEST_REPLICA_SET_URI. Without it the test skips, saying so. It calls process directly: settling a delivery is the
// same on both paths and covered by the FerretDB tests.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events/internal/servertest"
)

func TestContainerTransactions(t *testing.T) {
	t.Parallel()
	client := servertest.Connect(t, servertest.ReplicaSetURI(t))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := client.Database(servertest.UniqueName(t, "inbox_"))
	business := db.Collection("business")
	// Collections must exist before a transaction writes to them on
	// MongoDB before 4.4; creating them keeps the test about the inbox.
	if err := db.CreateCollection(ctx, business.Name()); err != nil {
		t.Fatal(err)
	}

	// The handler writes its business document, then does what the
	// message id says.
	var crash context.CancelFunc
	var mu sync.Mutex
	runs := map[string]int{}
	handle := func(ctx context.Context, d amqp.Delivery) error {
		mu.Lock()
		runs[d.MessageId]++
		mu.Unlock()
		if _, err := business.UpdateOne(ctx, bson.D{{Key: "_id", Value: d.MessageId}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}, options.UpdateOne().SetUpsert(true)); err != nil {
			return err
		}
		switch d.MessageId {
		case "fails":
			return errors.New("payment declined")
		case "panics":
			panic("nil order")
		case "crashes":
			crash() // the process dies before the commit
		}
		return nil
	}
	in, err := New(client, handle, Config{Database: db.Name()})
	if err != nil {
		t.Fatal(err)
	}
	servertest.Start(t, in)
	if !in.Transactional() || !in.ExpiresByTTL() {
		t.Fatalf("Transactional, ExpiresByTTL = %v, %v on a replica set; want true, true", in.Transactional(), in.ExpiresByTTL())
	}

	count := func(coll *mongo.Collection, id string) int64 {
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: id}})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tt := range []struct {
		id      string
		want    outcome
		written int64 // business document and inbox record
	}{
		{"ok", outcomeAck, 1},
		{"fails", outcomeRequeue, 0},
		{"panics", outcomeRequeue, 0},
		{"crashes", outcomeRequeue, 0},
	} {
		pctx, cancel := context.WithCancel(ctx)
		crash = cancel
		out, _ := in.process(pctx, amqp.Delivery{MessageId: tt.id})
		cancel()
		if out != tt.want {
			t.Errorf("%s: outcome %v, want %v", tt.id, out, tt.want)
		}
		if b, r := count(business, tt.id), count(in.records, tt.id); b != tt.written || r != tt.written {
			t.Errorf("%s: business documents %d, inbox records %d; want %d of each", tt.id, b, r, tt.written)
		}
	}

	// Copies of one message processed at once commit once.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := in.process(ctx, amqp.Delivery{MessageId: "concurrent"}); err != nil {
				t.Errorf("process concurrent copy: %v", err)
			}
		})
	}
	wg.Wait()
	var doc struct {
		N int `bson:"n"`
	}
	if err := business.FindOne(ctx, bson.D{{Key: "_id", Value: "concurrent"}}).Decode(&doc); err != nil || doc.N != 1 {
		t.Errorf("4 concurrent copies: business n = %d, %v; want committed once", doc.N, err)
	}
}
