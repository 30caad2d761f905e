package main

// The least-privilege roles of deploy/mongodb/roles.js against a MongoDB
// with authentication (the container suite: it needs Docker and skips,
// saying so, where there is none). worker setup runs as a user with
// outboxSetup, the relay with OUTBOX_SETUP=check as a user with
// outboxRelay and nothing else, and relays; a relay whose role lacks one
// action it needs fails, and MongoDB's refusal names the action.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// mongoRoles reads the roles of deploy/mongodb/roles.js: the JSON list
// between "roles: begin" and "roles: end" (deploy's TestMongoRoles checks
// their shape).
func mongoRoles(t *testing.T) []map[string]any {
	t.Helper()
	b, err := os.ReadFile("../../deploy/mongodb/roles.js")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok1 := strings.Cut(string(b), "// roles: begin\n")
	block, _, ok2 := strings.Cut(after, "// roles: end\n")
	if !ok1 || !ok2 {
		t.Fatal("deploy/mongodb/roles.js has no roles: begin ... roles: end block")
	}
	block = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(block), "const roles = "), ";")
	var roles []map[string]any
	if err := json.Unmarshal([]byte(block), &roles); err != nil {
		t.Fatalf("deploy/mongodb/roles.js: %v", err)
	}
	return roles
}

// withoutAction is role r renamed to name, with action taken out of the
// privilege on collection.
func withoutAction(t *testing.T, r map[string]any, name, collection, action string) map[string]any {
	t.Helper()
	var privileges []any
	found := false
	for _, p := range r["privileges"].([]any) {
		p := p.(map[string]any)
		res := p["resource"].(map[string]any)
		actions := p["actions"].([]any)
		if res["collection"] == collection {
			i := slices.Index(actions, any(action))
			if i >= 0 {
				found = true
				actions = slices.Delete(slices.Clone(actions), i, i+1)
			}
		}
		privileges = append(privileges, map[string]any{"resource": res, "actions": actions})
	}
	if !found {
		t.Fatalf("role %s has no %s on %s to take out", r["role"], action, collection)
	}
	return map[string]any{"role": name, "privileges": privileges, "roles": []any{}}
}

// userURI is rootURI with user and password in place of the root's.
func userURI(t *testing.T, rootURI, user, password string) string {
	t.Helper()
	u, err := url.Parse(rootURI)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	q := u.Query()
	q.Set("authSource", "admin")
	u.RawQuery = q.Encode()
	return u.String()
}

func TestContainerRoles(t *testing.T) {
	t.Parallel()
	rootURI, amqpURL := testenv.ContainersWithAuth(t, "root", "root-e2e")
	s := stack{name: "mongodb-auth", mongoURI: rootURI, amqpURL: amqpURL, atomicClaims: true}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	root := s.connect(t, 4)
	admin := root.Database("admin")

	// The roles as roles.js creates them, for its database and collection
	// (outbox.events), and a relay role that lacks listIndexes on the
	// outbox, which worker run needs at start with OUTBOX_SETUP=check.
	roles := mongoRoles(t)
	byName := map[string]map[string]any{}
	for _, r := range roles {
		byName[r["role"].(string)] = r
	}
	roles = append(roles, withoutAction(t, byName["outboxRelay"], "outboxRelayShort", "events", "listIndexes"))
	for _, r := range roles {
		cmd := bson.D{{Key: "createRole", Value: r["role"]}, {Key: "privileges", Value: r["privileges"]}, {Key: "roles", Value: bson.A{}}}
		if err := admin.RunCommand(ctx, cmd).Err(); err != nil {
			t.Fatalf("createRole %s: %v", r["role"], err)
		}
	}
	for user, role := range map[string]string{"setup": "outboxSetup", "relay": "outboxRelay", "short": "outboxRelayShort"} {
		cmd := bson.D{{Key: "createUser", Value: user}, {Key: "pwd", Value: user + "-pw"},
			{Key: "roles", Value: bson.A{bson.D{{Key: "role", Value: role}, {Key: "db", Value: "admin"}}}}}
		if err := admin.RunCommand(ctx, cmd).Err(); err != nil {
			t.Fatalf("createUser %s: %v", user, err)
		}
	}

	const database = "outbox" // roles.js's
	exchange := testenv.UniqueName(t, "ex_")
	recv := consume(t, s, exchange)

	// worker setup, as the setup user.
	setup := exec.CommandContext(ctx, workerBinary(t), "setup")
	setup.Env = append(os.Environ(), "OUTBOX_MONGO_URI="+userURI(t, rootURI, "setup", "setup-pw"), "OUTBOX_MONGO_DATABASE="+database)
	out, err := setup.CombinedOutput()
	if err != nil {
		t.Fatalf("worker setup as outboxSetup: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "created") {
		t.Errorf("worker setup as outboxSetup created nothing:\n%s", out)
	}

	// The relay, as the relay user, with OUTBOX_SETUP=check.
	coll := root.Database(database).Collection(mongo.CollectionDefault)
	var ids []string
	for i := range 50 {
		id := fmt.Sprintf("roles-%03d", i)
		if _, err := events.Insert(ctx, coll, events.Draft{ID: id, Type: "order.created", AggregateType: "order",
			AggregateID: fmt.Sprintf("o-%d", i%5), Payload: bson.D{{Key: "n", Value: i}}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	env := s.relayEnv(database, exchange, "relay-outboxRelay")
	env["OUTBOX_MONGO_URI"] = userURI(t, rootURI, "relay", "relay-pw")
	env["OUTBOX_SETUP"] = setupCheck
	env["OUTBOX_LOG_LEVEL"] = "info"
	relay := startWorker(t, "relay", env)
	recv.waitIDs(ctx, t, ids)
	stopWorkers(t, relay)
	if log := readLog(t, relay); strings.Contains(log, "not authorized") {
		t.Errorf("the relay with outboxRelay was refused something:\n%s", log)
	}
	published, err := coll.CountDocuments(ctx, bson.D{{Key: "status", Value: "PUBLISHED"}})
	if err != nil || published != int64(len(ids)) {
		t.Errorf("%d events PUBLISHED (%v), want %d", published, err, len(ids))
	}

	// One action less, and the relay cannot start: MongoDB's refusal
	// names the command, which is the action's name.
	short := s.relayEnv(database, exchange, "relay-short")
	short["OUTBOX_MONGO_URI"] = userURI(t, rootURI, "short", "short-pw")
	short["OUTBOX_SETUP"] = setupCheck
	p := startWorker(t, "short", short)
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		log := readLog(t, p)
		return strings.Contains(log, "not authorized") && strings.Contains(log, "listIndexes"),
			"the relay without listIndexes has not said it was refused listIndexes:\n" + p.Tail(10)
	})
	p.Kill()
}
