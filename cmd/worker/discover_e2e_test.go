package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// TestE2EFleetDiscovery: two replicas relay a database per tenant from a
// fleet file of one pattern entry. The three tenants of the start are
// relayed; a fourth, created while they run, is relayed without a
// restart; a dropped one is let go by both, which keep relaying the
// others; and an entry added to the file is relayed without a SIGHUP
// (the file watch).
func TestE2EFleetDiscovery(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	const n = 200
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(6*n)+3*time.Minute)
	defer cancel()
	start := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	client := s.connect(t, testenv.ClientMaxPoolSize)
	pattern, tenantDB := tenantDatabases(t, client)
	exchange := testenv.UniqueName(t, "ex_")
	tenant := func(name string) *fleetOutbox {
		db := tenantDB(name)
		o := &fleetOutbox{name: name, db: db, collection: "outbox", coll: db.Collection("outbox"), exchange: exchange}
		o.r = consumeOrdered(t, s, exchange, "fleet."+name) // insert's events are of type fleet.<name>
		return o
	}
	a, b, c := tenant("a"), tenant("b"), tenant("c")
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	for _, o := range []*fleetOutbox{a, b, c} {
		o.insert(ctx, t, base, n)
	}
	entry := fmt.Sprintf("outboxes:\n  - name: tenants\n    databases: %q\n    collection: outbox\n    exchange: %s\n", pattern, exchange)
	path := writeFleet(t, entry)

	ids := []string{pattern[:len(pattern)-2] + "-w0", pattern[:len(pattern)-2] + "-w1"}
	var procs []*workerproc.Proc
	for _, id := range ids {
		env := s.workerEnv("unused", "unused", id)
		env["OUTBOX_FLEET_FILE"] = path
		env["OUTBOX_FLEET_DISCOVERY_INTERVAL"] = "1s"
		env["OUTBOX_BATCH_SIZE"] = "50"
		env["OUTBOX_LOG_LEVEL"] = "info"
		procs = append(procs, startWorker(t, id, env))
	}
	for _, o := range []*fleetOutbox{a, b, c} {
		o.r.waitDistinct(ctx, t, n)
	}

	phase("the three tenants of the start relayed")
	d := tenant("d")
	d.insert(ctx, t, base, n)
	d.r.waitDistinct(ctx, t, n)
	waitLog(ctx, t, procs, `"added":["tenants/`+d.db.Name()+`"]`)

	phase("tenant d, created while running, relayed")
	// Dropped until both workers let it go: FerretDB's update creates a
	// collection it does not find (MongoDB's does not), so a claim or a
	// recovery of the tenant running just after the drop brings its
	// outbox collection back, and discovery sees it there. On MongoDB
	// the first drop is enough.
	removed := `"removed":["tenants/` + c.db.Name() + `"]`
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		if err := c.db.Drop(ctx); err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			if !strings.Contains(readLog(t, p), removed) {
				return false, fmt.Sprintf("no %s in %s's log yet", removed, p.Name())
			}
		}
		return true, ""
	})
	phase("tenant c, dropped, let go by both")
	later := &fleetOutbox{name: "a", db: a.db, coll: a.coll, r: a.r}
	later.insert(ctx, t, base.Add(time.Minute), n)
	a.r.waitDistinct(ctx, t, 2*n)
	for _, p := range procs {
		if names := statusOutboxes(ctx, t, p); !sameNames(names, "tenants/"+a.db.Name(), "tenants/"+b.db.Name(), "tenants/"+d.db.Name()) {
			t.Errorf("%s's /status lists %v after c was dropped, want a, b and d", p.Name(), names)
		}
	}

	phase("tenant a relayed on after c was let go")
	// An entry added to the file is relayed without SIGHUP.
	e := tenant("e")
	e.insert(ctx, t, base, n)
	if err := os.WriteFile(path, []byte(entry+fmt.Sprintf("  - name: extra\n    database: %s\n    collection: outbox\n    exchange: %s\n", e.db.Name(), exchange)), 0o600); err != nil {
		t.Fatal(err)
	}
	waitLog(ctx, t, procs, `"added":["extra"]`)
	e.r.waitDistinct(ctx, t, n)

	phase("entry extra, added to the file, relayed")
	stopWorkers(t, procs...)
	a.ids = append(a.ids, later.ids...)
	a.byAggregate = nil
	for _, o := range []*fleetOutbox{a, b, d, e} {
		o.r.drain(t)
		o.check(t)
	}
}

// waitLog waits until every worker's log holds want.
func waitLog(ctx context.Context, t *testing.T, procs []*workerproc.Proc, want string) {
	t.Helper()
	for _, p := range procs {
		testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
			return strings.Contains(readLog(t, p), want), fmt.Sprintf("no %s in %s's log yet", want, p.Name())
		})
	}
}

// statusOutboxes lists the outboxes p's /status reports on.
func statusOutboxes(ctx context.Context, t *testing.T, p *workerproc.Proc) []string {
	t.Helper()
	var status struct {
		Outboxes []struct {
			Outbox string `json:"outbox"`
		} `json:"outboxes"`
	}
	getStatus(ctx, t, p, &status)
	var names []string
	for _, o := range status.Outboxes {
		names = append(names, o.Outbox)
	}
	return names
}

func sameNames(got []string, want ...string) bool {
	return strings.Join(got, ",") == strings.Join(want, ",")
}
