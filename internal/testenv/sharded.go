package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Sharded is the container suite's sharded MongoDB: a config server
// replica set, two shard replica sets and a mongos router, each a
// single member of MongoImage, on a Docker network of their own.
type Sharded struct {
	// URI is the mongos router's, for a worker or a client of the test's
	// own.
	URI string
	// Client is a client of the router, disconnected in t.Cleanup.
	Client *mongo.Client
	// Shards are the shards' names, as the router knows them.
	Shards []string
}

// shardedPort is the port every server of the cluster listens on inside
// its container; each is known to the others by its network alias.
const shardedPort = "27017"

// shardedReadyTimeout bounds the wait for a replica set's primary and for
// the router to take a shard: seconds on a quiet host.
const shardedReadyTimeout = 2 * time.Minute

// ShardedCluster starts Sharded: RequireDocker (skip, or fail when
// required), then the five containers, removed in t.Cleanup with their
// network. The balancer is stopped, so that the chunks stay where a test
// puts them (ShardTwoWays).
func ShardedCluster(t testing.TB) Sharded {
	t.Helper()
	RequireDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), containerStartTimeout)
	defer cancel()
	nw, err := network.New(ctx)
	testcontainers.CleanupNetwork(t, nw)
	if err != nil {
		t.Fatalf("testenv: create a Docker network: %v", err)
	}
	// Each member registers under its alias, which only the other
	// containers resolve: the test reaches the replica sets through
	// their mapped ports with direct connections, and everything else
	// through the router.
	replicaSetMember(ctx, t, nw, "cfg", "--configsvr")
	shards := []string{"shard0", "shard1"}
	for _, name := range shards {
		replicaSetMember(ctx, t, nw, name, "--shardsvr")
	}
	router := startServer(ctx, t, nw, "mongos",
		"mongos", "--configdb", "cfg/cfg:"+shardedPort, "--bind_ip_all", "--port", shardedPort)
	uri := "mongodb://" + router + "/"
	client := connect(t, uri, "")
	for _, name := range shards {
		// The router may not have read the config servers yet.
		var err error
		Eventually(t, shardedReadyTimeout, func() (bool, string) {
			err = adminCommand(ctx, client, bson.D{{Key: "addShard", Value: name + "/" + name + ":" + shardedPort}, {Key: "name", Value: name}})
			return err == nil, fmt.Sprintf("addShard %s: %v", name, err)
		})
	}
	if err := adminCommand(ctx, client, bson.D{{Key: "balancerStop", Value: 1}}); err != nil {
		t.Fatalf("testenv: stop the balancer: %v", err)
	}
	return Sharded{URI: uri, Client: client, Shards: shards}
}

// replicaSetMember starts mongod as the only member of replica set name
// (with role, --configsvr or --shardsvr), initiates the set and waits for
// its primary.
func replicaSetMember(ctx context.Context, t testing.TB, nw *testcontainers.DockerNetwork, name, role string) {
	t.Helper()
	addr := startServer(ctx, t, nw, name,
		"mongod", role, "--replSet", name, "--bind_ip_all", "--port", shardedPort)
	client := connect(t, "mongodb://"+addr+"/?directConnection=true", "")
	config := bson.D{
		{Key: "_id", Value: name},
		{Key: "configsvr", Value: role == "--configsvr"},
		{Key: "members", Value: bson.A{bson.D{{Key: "_id", Value: 0}, {Key: "host", Value: name + ":" + shardedPort}}}},
	}
	if err := adminCommand(ctx, client, bson.D{{Key: "replSetInitiate", Value: config}}); err != nil {
		t.Fatalf("testenv: initiate replica set %s: %v", name, err)
	}
	Eventually(t, shardedReadyTimeout, func() (bool, string) {
		var hello struct {
			Primary bool `bson:"isWritablePrimary"`
		}
		err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello)
		return err == nil && hello.Primary, fmt.Sprintf("replica set %s has no primary yet (hello: %v)", name, err)
	})
}

// startServer starts MongoImage running cmd, known on nw as alias,
// removed in t.Cleanup, and returns its mapped address, host:port.
func startServer(ctx context.Context, t testing.TB, nw *testcontainers.DockerNetwork, alias string, cmd ...string) string {
	t.Helper()
	c, err := testcontainers.Run(ctx, MongoImage,
		network.WithNetwork([]string{alias}, nw),
		testcontainers.WithCmd(cmd...),
		testcontainers.WithExposedPorts(shardedPort+"/tcp"),
		testcontainers.WithWaitStrategy(wait.ForLog("Waiting for connections")),
	)
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatalf("testenv: start %s (%s): %v", alias, MongoImage, err)
	}
	addr, err := c.PortEndpoint(ctx, shardedPort+"/tcp", "")
	if err != nil {
		t.Fatalf("testenv: address of %s: %v", alias, err)
	}
	return addr
}

// ShardTwoWays shards the collection ns (database.collection) on key and
// splits it at middle, a value of the whole key: the chunk below middle
// stays on the shard the collection began on, first, and the chunk from
// middle on goes to the other shard, second.
func (c Sharded) ShardTwoWays(t testing.TB, ns string, key, middle bson.D) (first, second string) {
	t.Helper()
	ctx := t.Context()
	if err := adminCommand(ctx, c.Client, bson.D{{Key: "shardCollection", Value: ns}, {Key: "key", Value: key}}); err != nil {
		t.Fatalf("testenv: shard %s on %v: %v", ns, key, err)
	}
	var lowest bson.D
	for _, e := range key {
		lowest = append(lowest, bson.E{Key: e.Key, Value: bson.MinKey{}})
	}
	first = c.chunkOwner(t, ns, lowest)
	second = c.Shards[0]
	if second == first {
		second = c.Shards[1]
	}
	if err := adminCommand(ctx, c.Client, bson.D{{Key: "split", Value: ns}, {Key: "middle", Value: middle}}); err != nil {
		t.Fatalf("testenv: split %s at %v: %v", ns, middle, err)
	}
	if c.chunkOwner(t, ns, middle) == second {
		return first, second
	}
	move := bson.D{{Key: "moveChunk", Value: ns}, {Key: "find", Value: middle}, {Key: "to", Value: second}, {Key: "_waitForDelete", Value: true}}
	if err := adminCommand(ctx, c.Client, move); err != nil {
		t.Fatalf("testenv: move the chunk of %s at %v to %s: %v", ns, middle, second, err)
	}
	if owner := c.chunkOwner(t, ns, middle); owner != second {
		t.Fatalf("testenv: the chunk of %s at %v is on %s after its move to %s", ns, middle, owner, second)
	}
	return first, second
}

// chunkOwner is the shard that holds the chunk of ns beginning at start.
func (c Sharded) chunkOwner(t testing.TB, ns string, start bson.D) string {
	t.Helper()
	owner, err := c.chunkShard(t.Context(), ns, start)
	if err != nil || owner == "" {
		t.Fatalf("testenv: chunk of %s at %v: shard %q, %v", ns, start, owner, err)
	}
	return owner
}

// chunkShard reads the config database: the chunks name their collection
// by its UUID. It returns "" where no chunk begins at start.
func (c Sharded) chunkShard(ctx context.Context, ns string, start bson.D) (string, error) {
	config := c.Client.Database("config")
	var coll struct {
		UUID bson.Binary `bson:"uuid"`
	}
	if err := config.Collection("collections").FindOne(ctx, bson.D{{Key: "_id", Value: ns}}).Decode(&coll); err != nil {
		return "", fmt.Errorf("read config.collections: %w", err)
	}
	var chunk struct {
		Shard string `bson:"shard"`
	}
	err := config.Collection("chunks").FindOne(ctx, bson.D{{Key: "uuid", Value: coll.UUID}, {Key: "min", Value: start}}).Decode(&chunk)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read config.chunks: %w", err)
	}
	return chunk.Shard, nil
}

func adminCommand(ctx context.Context, client *mongo.Client, cmd bson.D) error {
	return client.Database("admin").RunCommand(ctx, cmd).Err()
}
