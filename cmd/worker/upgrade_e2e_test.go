package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// lastRelease is the version the rolling-upgrade test starts from: the
// newest release CHANGELOG.md records, with the commit it was built from
// (scripts/release-notes.sh --last), so that every release is tested
// against the one before it. OUTBOX_TEST_UPGRADE_FROM names another
// revision instead.
func lastRelease(t *testing.T) (name, rev string) {
	t.Helper()
	if v := os.Getenv("OUTBOX_TEST_UPGRADE_FROM"); v != "" {
		return v, v
	}
	out, err := exec.CommandContext(t.Context(), "bash", "../../scripts/release-notes.sh", "--last").Output()
	if err != nil {
		t.Fatalf("scripts/release-notes.sh --last: %v (the rolling-upgrade test starts from the last release CHANGELOG.md records)", err)
	}
	name, rev, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok {
		t.Fatalf("scripts/release-notes.sh --last printed %q, want \"vX.Y.Z <commit>\"", out)
	}
	return name, rev
}

// buildRevision builds the worker of rev, a revision of this
// repository's history, exported with git archive into a temporary
// directory (as make baseline-worker does): the work tree is not touched.
// It needs git and a clone with history; without them the test fails,
// saying so.
func buildRevision(t *testing.T, rev string) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), "git", "-C", root, "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("revision %s is not in this clone (%v: %s): the rolling-upgrade test builds it from the repository's history; fetch it (git fetch --unshallow)", rev, err, out)
	}
	src := t.TempDir()
	archive := exec.CommandContext(t.Context(), "sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", rev, err, out)
	}
	bin := filepath.Join(t.TempDir(), "worker-"+rev)
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/worker")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the worker of %s: %v\n%s", rev, err, out)
	}
	return bin
}

// upgradeAggregates are the aggregates of the steady load, one event
// each per upgradePace (16 events a second: well within what FerretDB
// relays on a busy host, so that the test watches the handoff, not a
// backlog): every event of an aggregate is a later millisecond than the
// one before.
const (
	upgradeAggregates = 4
	upgradePace       = 250 * time.Millisecond
	upgradeReplicas   = 3
	// upgradeGrace is the pods' grace period: the worker's default
	// shutdown timeout (30 s), which the test gives its replicas, and
	// 10 s (deploy/kubernetes).
	upgradeGrace = 40 * time.Second
)

// TestRollingUpgrade: three replicas of the last release relay a steady
// insert load; they are replaced one by one by replicas of this version
// (a new one started and holding partitions, then an old one stopped
// with SIGTERM, as a Kubernetes rolling update does, but the second
// killed with SIGKILL, as a node that dies mid-rollout), and then the
// same back (a rollback) with the second new one killed. Every event is
// delivered, none is FAILED, the first delivery of each aggregate's
// events is in their order, and each duplicate is an event claimed more
// than once (a handoff, or the claims of a killed replica recovered),
// which its document shows.
// It runs on FerretDB here, and on a MongoDB replica set in the container
// suite (TestContainers), where the two versions share the database's
// fence.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	rollingUpgradeScenario(t, localStack(t))
}

func rollingUpgradeScenario(t *testing.T, s stack) {
	release, rev := lastRelease(t)
	oldBin := buildRevision(t, rev)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	db := s.database(t)
	coll := db.Collection("events")
	exchange := testenv.UniqueName(t, "ex_")
	r := consumeOrdered(t, s, exchange, "#")

	start := func(bin, name string) *workerproc.Proc {
		env := s.relayEnv(db.Name(), exchange, db.Name()+"-"+name)
		env["OUTBOX_LOG_LEVEL"] = "info"
		env["OUTBOX_BATCH_SIZE"] = "100"
		env["OUTBOX_SHUTDOWN_TIMEOUT"] = "30s"
		return startWorkerBin(t, bin, name, env)
	}
	// roll replaces the replicas from by replicas of bin, one at a time;
	// the one at index killAt is killed rather than stopped.
	const killAt = 1
	roll := func(from []*workerproc.Proc, bin, prefix, what string) []*workerproc.Proc {
		to := make([]*workerproc.Proc, len(from))
		for i := range from {
			to[i] = start(bin, fmt.Sprintf("%s%d", prefix, i))
			waitOwning(ctx, t, to[i])
			if i == killAt {
				from[i].Kill()
				t.Logf("killed %s (SIGKILL) mid-%s", from[i].Name(), what)
			} else {
				stopLikeKubernetes(t, from[i])
			}
			t.Logf("%s: replaced %s by %s; %d events received", what, from[i].Name(), to[i].Name(), r.distinct())
		}
		return to
	}
	old := make([]*workerproc.Proc, upgradeReplicas)
	for i := range old {
		old[i] = start(oldBin, fmt.Sprintf("old%d", i))
	}

	load := startLoad(ctx, t, coll)
	explained(t, coll, func() { r.waitDistinct(ctx, t, upgradeAggregates*5) })
	current := roll(old, workerBinary(t), "new", "upgrade from "+release)
	// This version alone relays a while of the load, then the rollback.
	explained(t, coll, func() { r.waitDistinct(ctx, t, r.distinct()+upgradeAggregates*5) })
	back := roll(current, oldBin, "back", "rollback to "+release)
	explained(t, coll, func() { r.waitDistinct(ctx, t, r.distinct()+upgradeAggregates*5) })
	byAggregate := load.stop()
	var ids []string
	for _, agg := range byAggregate {
		ids = append(ids, agg...)
	}
	explained(t, coll, func() { r.waitIDs(ctx, t, ids) })
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(len(ids)))
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}}); err != nil || n != 0 {
		t.Errorf("%d events FAILED (%v) over the upgrade and rollback, want 0", n, err)
	}
	for _, p := range back {
		stopLikeKubernetes(t, p)
	}
	r.drain(t)

	first := r.firstArrivals()
	for agg, evs := range byAggregate {
		for i := 1; i < len(evs); i++ {
			if first[evs[i]] < first[evs[i-1]] {
				t.Errorf("aggregate %s: %s (event %d) first arrived before %s (event %d)", agg, evs[i], i, evs[i-1], i-1)
				break
			}
		}
	}
	dups := r.duplicates()
	t.Logf("%d events over a rolling upgrade from %s (%s) and back; %d delivered more than once", len(ids), release, rev, len(dups))
	for id, n := range dups {
		attempts := attemptsOf(ctx, t, coll, id)
		if attempts < 2 {
			t.Errorf("event %s arrived %d times but was claimed %d time(s): a duplicate that no handoff explains", id, n, attempts)
		}
	}
}

// stopLikeKubernetes stops p as the kubelet stops a pod: SIGTERM, then
// SIGKILL after the grace period. A stop that overran the shutdown
// timeout (a slow database) is logged, not failed: what the replica still
// held is recovered after the stale threshold, and delivered then, which
// the test's checks cover.
func stopLikeKubernetes(t *testing.T, p *workerproc.Proc) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Error(err)
	}
	state, exited := p.Wait(upgradeGrace)
	switch {
	case !exited:
		p.Kill()
		t.Logf("%s still running %s after SIGTERM: killed, as the kubelet does", p.Name(), upgradeGrace)
	case state.ExitCode() != 0:
		t.Logf("%s exited %d after SIGTERM: its stop overran the shutdown timeout:\n%s", p.Name(), state.ExitCode(), p.Tail(3))
	}
}

// waitOwning waits until p's /status says it owns a partition.
func waitOwning(ctx context.Context, t *testing.T, p *workerproc.Proc) {
	t.Helper()
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		var status struct {
			Ownership *struct{ Partitions int } `json:"ownership"`
		}
		code, body := workerGet(ctx, t, p, "/status")
		if code != http.StatusOK && code != http.StatusServiceUnavailable {
			return false, fmt.Sprintf("%s: GET /status = %d %s", p.Name(), code, body)
		}
		if err := json.Unmarshal(body, &status); err != nil || status.Ownership == nil {
			return false, fmt.Sprintf("%s: /status %s", p.Name(), body)
		}
		return status.Ownership.Partitions > 0, fmt.Sprintf("%s owns no partition yet", p.Name())
	})
}

// attemptsOf is how many times event id (a message id) was claimed.
func attemptsOf(ctx context.Context, t *testing.T, coll *driver.Collection, id string) int {
	t.Helper()
	oid, err := bson.ObjectIDFromHex(id)
	if err != nil {
		t.Fatalf("message id %s: %v", id, err)
	}
	var doc struct {
		Attempts int `bson:"attempts"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: oid}}).Decode(&doc); err != nil {
		t.Fatalf("find %s: %v", id, err)
	}
	return doc.Attempts
}

// steadyLoad inserts one event per aggregate every upgradePace until
// stopped, and records each aggregate's message ids in insertion order.
type steadyLoad struct {
	stopped chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	ids     map[string][]string
}

func startLoad(ctx context.Context, t *testing.T, coll *driver.Collection) *steadyLoad {
	l := &steadyLoad{stopped: make(chan struct{}), done: make(chan struct{}), ids: map[string][]string{}}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(upgradePace)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			docs := make([]any, 0, upgradeAggregates)
			batch := map[string]string{}
			for a := range upgradeAggregates {
				agg := "u-" + strconv.Itoa(a)
				d, err := events.Draft{Type: "e2e.upgrade", AggregateType: "e2e", AggregateID: agg,
					Payload: bson.D{{Key: "seq", Value: seq}}}.Document(time.Now())
				if err != nil {
					t.Error(err)
					return
				}
				docs = append(docs, d)
				batch[agg] = testenv.MessageID(d[0].Value)
			}
			// Not cut short by stop: every event inserted is recorded.
			if _, err := coll.InsertMany(ctx, docs); err != nil {
				t.Errorf("insert the load: %v", err)
				return
			}
			l.mu.Lock()
			for agg, id := range batch {
				l.ids[agg] = append(l.ids[agg], id)
			}
			l.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-l.stopped:
				return
			case <-tick.C:
			}
		}
	}()
	return l
}

// stop ends the load and returns the ids inserted, by aggregate, in order.
func (l *steadyLoad) stop() map[string][]string {
	close(l.stopped)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]string, len(l.ids))
	for agg, ids := range l.ids {
		out[agg] = slices.Clone(ids)
	}
	return out
}
