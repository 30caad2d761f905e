package main

// Discovery, for a database per tenant: an entry of the fleet file may
// name a pattern of databases (databases: "tenant_*") rather than one.
// Every OUTBOX_FLEET_DISCOVERY_INTERVAL the worker lists the databases of
// each such entry's cluster and relays the entry's collection in each
// one that matches and holds it, as an outbox of its own named
// "<entry>/<database>".
// The outboxes wanted are the file's entries of one database and those
// discovered; a reload (reload.go) brings the running ones to them, so
// that a database that appears is relayed without a restart, and one
// that disappears is let go as a removed entry is (its claimer finishes
// its batch, its partitions are given back). A listing that fails (the
// cluster is down) changes nothing: the outboxes found before keep
// relaying, and the next interval tries again.

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/fleet"
	"github.com/outboxrelay/outbox/internal/redact"
)

// DiscoveryIntervalDefault is OUTBOX_FLEET_DISCOVERY_INTERVAL's default:
// a tenant created is relayed within it, and each cluster is asked for
// its list of databases once per interval per replica.
const DiscoveryIntervalDefault = 30 * time.Second

// listTimeout bounds one listing of a cluster's databases: a cluster that
// does not answer must not hold the reloads (and the stop) that wait
// behind discovery.
const listTimeout = 10 * time.Second

// found is what one listing found for an entry of a pattern: the
// databases of the cluster at uri.
type found struct {
	uri       string
	databases []string
}

// discovery is what discovery keeps from one interval to the next, all
// of it touched by run's goroutine alone.
type discovery struct {
	// found is what the last listing that worked found, by entry name.
	found map[string]found
	// failing are the entries whose last listing failed, and warned the
	// skipped databases said so: each is logged once, not every interval.
	failing, warned map[string]bool
	// list, if set, lists in place of worker.listDatabases (tests).
	list func(ctx context.Context, tmpl outboxConfig) ([]string, error)
}

func newDiscovery() *discovery {
	return &discovery{found: map[string]found{}, failing: map[string]bool{}, warned: map[string]bool{}}
}

// skippedDatabase is a database a pattern matched that is not relayed,
// and why.
type skippedDatabase struct {
	entry, database, why string
}

// expandOutboxes returns the outboxes spec (the fleet file's entries)
// stands for, in the file's order: each entry of one database as it is;
// for each entry of a pattern, one outbox per database of found[entry]
// that matches, by name (only what was listed on the entry's own
// cluster: a changed URI waits for a listing of the new one). A matched
// database that cannot name an outbox, or whose collection an earlier
// outbox relays, is skipped, and said so. The OUTBOX_BATCH_BYTES=auto
// bound is shared among all of them.
func expandOutboxes(spec []outboxConfig, byEntry map[string]found) (out []outboxConfig, skipped []skippedDatabase) {
	for _, oc := range spec {
		if !oc.template() {
			out = append(out, oc)
		}
	}
	for _, tmpl := range spec {
		f, ok := byEntry[tmpl.Name]
		if !tmpl.template() || !ok || f.uri != tmpl.MongoURI {
			continue
		}
		for _, db := range f.databases {
			oc, why := discoveredOutbox(tmpl, db, out)
			switch {
			case oc != nil:
				out = append(out, *oc)
			case why != "":
				skipped = append(skipped, skippedDatabase{tmpl.Name, db, why})
			}
		}
	}
	out = inFileOrder(spec, out)
	shareBatchBytes(out)
	return out, skipped
}

// discoveredOutbox is the outbox of tmpl in database db: nil if the
// pattern does not match db, or, with why, if it may not be relayed
// beside others (the outboxes already wanted).
func discoveredOutbox(tmpl outboxConfig, db string, others []outboxConfig) (*outboxConfig, string) {
	if !fleet.Matches(tmpl.Databases, db) {
		return nil, ""
	}
	name, err := fleet.DiscoveredName(tmpl.Name, db)
	if err != nil {
		return nil, err.Error()
	}
	c := tmpl.Config
	c.MongoDatabase = db
	if err := c.validate(); err != nil {
		return nil, err.Error() // loadOutboxes validated the entry as any database
	}
	oc := outboxConfig{Name: name, Config: c}
	if err := checkApart(oc, others); err != nil {
		return nil, err.Error()
	}
	return &oc, ""
}

// inFileOrder orders outboxes as the file lists their entries, the
// outboxes of one pattern by database name, for /status and the logs.
func inFileOrder(spec []outboxConfig, outboxes []outboxConfig) []outboxConfig {
	rank := map[string]int{}
	for i, oc := range spec {
		rank[oc.Name] = i
	}
	entryOf := func(oc outboxConfig) string {
		if entry, _, ok := fleet.SplitDiscoveredName(oc.Name); ok {
			return entry
		}
		return oc.Name
	}
	slices.SortStableFunc(outboxes, func(a, b outboxConfig) int {
		if d := rank[entryOf(a)] - rank[entryOf(b)]; d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	return outboxes
}

// listFilter is the filter of a listing for pattern: the names that start
// as it does, so that a cluster of many databases sends only the
// candidates; fleet.Matches decides.
func listFilter(pattern string) bson.D {
	prefix := pattern
	if i := strings.IndexAny(pattern, `*?[\`); i >= 0 {
		prefix = pattern[:i]
	}
	if prefix == "" {
		return bson.D{}
	}
	return bson.D{{Key: "name", Value: bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(prefix)}}}}
}

// listDatabases lists the databases of tmpl's cluster that match its
// pattern and hold its collection. A database counts only once its
// outbox collection exists, and no longer once that is gone: a relay
// writes into a tenant's database (its partitions' owners), and a write
// just after the database was dropped would create it again, so the
// database alone would keep a dropped tenant relayed for ever. A
// database whose collection could not be listed counts if it did before.
// authorizedDatabases lets a user without the listDatabases privilege see
// the databases it may use.
func (w *worker) listDatabases(ctx context.Context, tmpl outboxConfig) ([]string, error) {
	client, err := w.client(tmpl.MongoURI)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	names, err := client.ListDatabaseNames(ctx, listFilter(tmpl.Databases), options.ListDatabases().SetAuthorizedDatabases(true))
	if err != nil {
		return nil, err
	}
	before := w.discovery.found[tmpl.Name]
	var out []string
	for _, db := range names {
		if !fleet.Matches(tmpl.Databases, db) {
			continue
		}
		colls, err := client.Database(db).ListCollectionNames(ctx, bson.D{{Key: "name", Value: tmpl.MongoCollection}})
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, err
		case err != nil:
			if slices.Contains(before.databases, db) && before.uri == tmpl.MongoURI {
				out = append(out, db)
			}
		case len(colls) > 0:
			out = append(out, db)
		}
	}
	return out, nil
}

// discover lists the databases of each entry of a pattern and returns the
// outboxes wanted now. An entry whose listing fails keeps what it found
// before, so that a cluster that is down drops none of its outboxes.
func (w *worker) discover(ctx context.Context) []outboxConfig {
	for _, tmpl := range w.spec {
		if !tmpl.template() {
			continue
		}
		list := w.listDatabases
		if w.discovery.list != nil {
			list = w.discovery.list
		}
		dbs, err := list(ctx, tmpl)
		w.noteListing(tmpl, err)
		if err == nil {
			w.discovery.found[tmpl.Name] = found{uri: tmpl.MongoURI, databases: dbs}
		}
	}
	for name := range w.discovery.found {
		if !slices.ContainsFunc(w.spec, func(oc outboxConfig) bool { return oc.Name == name && oc.template() }) {
			delete(w.discovery.found, name) // an entry the file no longer has
		}
	}
	next, skipped := expandOutboxes(w.spec, w.discovery.found)
	for _, s := range skipped {
		key := s.entry + "/" + s.database + ": " + s.why
		if !w.discovery.warned[key] {
			w.discovery.warned[key] = true
			w.logger.Warn("discovery: database matched but not relayed", "entry", s.entry, "database", s.database, "why", s.why)
		}
	}
	return next
}

// noteListing logs a listing's failure once while it lasts, and its end.
func (w *worker) noteListing(tmpl outboxConfig, err error) {
	was := w.discovery.failing[tmpl.Name]
	switch {
	case err != nil && errors.Is(err, context.Canceled):
	case err != nil && !was:
		w.discovery.failing[tmpl.Name] = true
		w.logger.Warn("discovery: databases not listed; the outboxes found before keep relaying, and the next interval tries again",
			"entry", tmpl.Name, "mongo_uri", redact.URL(tmpl.MongoURI), "error", err)
	case err != nil:
		w.logger.Debug("discovery: databases still not listed", "entry", tmpl.Name, "error", err)
	case was:
		delete(w.discovery.failing, tmpl.Name)
		w.logger.Info("discovery: databases listed again", "entry", tmpl.Name)
	}
}

// hasTemplates reports whether the fleet file has an entry of a pattern.
func (w *worker) hasTemplates() bool {
	return slices.ContainsFunc(w.spec, outboxConfig.template)
}

// discoveryTicks is the channel of discovery's interval, nil (never)
// while no entry names a pattern; stop releases it.
func (w *worker) discoveryTicks() (ticks <-chan time.Time, stop func()) {
	if !w.fleet() {
		return nil, func() {}
	}
	t := time.NewTicker(w.cfg.DiscoveryInterval)
	return t.C, t.Stop
}
