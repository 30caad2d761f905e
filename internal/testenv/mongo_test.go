package testenv

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestDatabaseInsertFind(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := Database(t)
	if !strings.HasPrefix(db.Name(), "t_") {
		t.Errorf("Database name = %q, want prefix t_", db.Name())
	}
	coll := db.Collection("events")

	type event struct {
		ID      bson.ObjectID `bson:"_id"`
		Status  string        `bson:"status"`
		Payload string        `bson:"payload"`
	}
	want := event{ID: bson.NewObjectID(), Status: "NEW", Payload: "hello"}
	if _, err := coll.InsertOne(ctx, want); err != nil {
		t.Fatalf("InsertOne: %v", err)
	}
	var got event
	if err := coll.FindOne(ctx, bson.D{{Key: "status", Value: "NEW"}}).Decode(&got); err != nil {
		t.Fatalf("FindOne: %v", err)
	}
	if got != want {
		t.Errorf("FindOne = %+v, want %+v", got, want)
	}
}

func TestDatabaseIsolated(t *testing.T) {
	t.Parallel()
	a, b := Database(t), Database(t)
	if a.Name() == b.Name() {
		t.Fatalf("two Database calls share name %q", a.Name())
	}
	if _, err := a.Collection("c").InsertOne(t.Context(), bson.D{{Key: "x", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	n, err := b.Collection("c").CountDocuments(t.Context(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("second database sees %d documents of the first, want 0", n)
	}
}

func TestMongoThroughProxy(t *testing.T) {
	t.Parallel()
	uri := MongoURI(t)
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(t, u.Host)
	proxied, err := ProxyURI(uri, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	client, err := mongo.Connect(options.Client().ApplyURI(proxied).
		SetMaxPoolSize(2).
		SetServerSelectionTimeout(2 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })

	ping := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		return client.Ping(ctx, nil)
	}
	if err := ping(); err != nil {
		t.Fatalf("ping through proxy: %v", err)
	}
	if p.Conns() == 0 {
		t.Fatal("ping succeeded but no connection went through the proxy")
	}

	p.Cut()
	if err := ping(); err == nil {
		t.Fatal("ping succeeded while the proxy was cut")
	}

	p.Restore()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := ping()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ping still failing after Restore: %v", err)
		}
	}
}

func TestStartFerretWithoutPostgres(t *testing.T) {
	t.Parallel()
	_, err := startFerret("postgres://postgres:secret@127.0.0.1:1/postgres?connect_timeout=2")
	if err == nil {
		t.Fatal("startFerret with no PostgreSQL: no error")
	}
	msg := err.Error()
	for _, want := range []string{"PostgreSQL", "pg_ctlcluster", EnvPostgresURL, EnvMongoURI} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "secret") {
		t.Errorf("error leaks the password:\n%s", msg)
	}
}
