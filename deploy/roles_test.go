package deploy

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/mongo"
)

// role is a MongoDB role as deploy/mongodb/roles.js creates it.
type role struct {
	Role       string `json:"role"`
	Privileges []struct {
		Resource struct {
			DB         *string `json:"db"`
			Collection *string `json:"collection"`
		} `json:"resource"`
		Actions []string `json:"actions"`
	} `json:"privileges"`
	Roles []any `json:"roles"`
}

// readRoles reads the JSON list between "roles: begin" and "roles: end"
// of deploy/mongodb/roles.js.
func readRoles(t *testing.T) map[string]role {
	t.Helper()
	b, err := os.ReadFile("mongodb/roles.js")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	_, after, ok1 := strings.Cut(text, "// roles: begin\n")
	block, _, ok2 := strings.Cut(after, "// roles: end\n")
	if !ok1 || !ok2 {
		t.Fatal("deploy/mongodb/roles.js has no \"// roles: begin\" ... \"// roles: end\" block")
	}
	block = strings.TrimSpace(block)
	block = strings.TrimSuffix(strings.TrimPrefix(block, "const roles = "), ";")
	var list []role
	if err := json.Unmarshal([]byte(block), &list); err != nil {
		t.Fatalf("deploy/mongodb/roles.js: the roles are not plain JSON: %v", err)
	}
	out := map[string]role{}
	for _, r := range list {
		out[r.Role] = r
	}
	return out
}

// workerEnvFile reads deploy/kubernetes/worker.env.
func workerEnvFile(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("kubernetes/worker.env")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			env[k] = v
		}
	}
	return env
}

// actionsByCollection is what a role may do, collection by collection;
// it fails the test on a privilege that is not one collection of the
// outbox's database (a whole database, the cluster, any resource).
func actionsByCollection(t *testing.T, r role, db string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range r.Privileges {
		res := p.Resource
		switch {
		case res.DB == nil || res.Collection == nil:
			t.Errorf("role %s: a privilege on %+v, not on one collection", r.Role, res)
		case *res.DB != db:
			t.Errorf("role %s: a privilege on database %q, want %q (worker.env)", r.Role, *res.DB, db)
		case *res.Collection == "":
			t.Errorf("role %s: a privilege on every collection of %s: name each", r.Role, db)
		default:
			out[*res.Collection] = append(out[*res.Collection], p.Actions...)
		}
	}
	if len(r.Roles) != 0 {
		t.Errorf("role %s inherits roles %v: each role lists what it may do", r.Role, r.Roles)
	}
	return out
}

func collectionsOf(m map[string][]string) []string {
	k := make([]string, 0, len(m))
	for c := range m {
		k = append(k, c)
	}
	sort.Strings(k)
	return k
}

// TestMongoRoles: least privilege, checked against the collections the
// worker owns (package mongo's suffixes) and worker.env's names. The
// relay may read and write the outbox, owners and fence collections and
// read the paused types, and create nothing; setup may create the
// collections and indexes of the schema and the fence documents, and
// write no event; the console only reads.
func TestMongoRoles(t *testing.T) {
	t.Parallel()
	roles := readRoles(t)
	env := workerEnvFile(t)
	db, coll := env["OUTBOX_MONGO_DATABASE"], env["OUTBOX_MONGO_COLLECTION"]
	if db == "" || coll == "" {
		t.Fatal("worker.env sets no OUTBOX_MONGO_DATABASE or OUTBOX_MONGO_COLLECTION")
	}
	outbox, owners, fences := coll, coll+mongo.OwnersSuffix, coll+mongo.FencesSuffix
	paused, audit := coll+mongo.PausedSuffix, coll+mongo.AuditSuffix

	for _, tc := range []struct {
		role        string
		collections []string
		allowed     map[string][]string // collection -> the actions it may have
		required    map[string][]string // collection -> actions it must have
	}{
		{
			role:        "outboxRelay",
			collections: []string{outbox, fences, owners, paused},
			allowed: map[string][]string{
				outbox: {"find", "update", "remove", "listIndexes", "changeStream"},
				owners: {"find", "insert", "update", "remove", "listIndexes"},
				fences: {"find", "insert", "update", "listIndexes"},
				paused: {"find"},
			},
			required: map[string][]string{
				outbox: {"find", "update", "listIndexes"}, owners: {"find", "insert", "update", "listIndexes"},
				fences: {"find", "insert", "update", "listIndexes"}, paused: {"find"},
			},
		},
		{
			role:        "outboxSetup",
			collections: []string{outbox, audit, fences, owners, paused},
			allowed: map[string][]string{
				outbox: {"createCollection", "createIndex", "listIndexes"},
				owners: {"createCollection", "createIndex", "listIndexes"},
				fences: {"createCollection", "createIndex", "listIndexes", "find", "insert"},
				paused: {"createCollection", "createIndex", "listIndexes"},
				audit:  {"createCollection", "createIndex", "listIndexes"},
			},
			required: map[string][]string{
				outbox: {"createCollection", "createIndex", "listIndexes"}, fences: {"find", "insert"},
			},
		},
		{
			role:        "outboxConsole",
			collections: []string{outbox, audit, paused},
			allowed:     map[string][]string{outbox: {"find", "listIndexes"}, paused: {"find"}, audit: {"find"}},
			required:    map[string][]string{outbox: {"find"}},
		},
		{
			role:        "outboxOperator",
			collections: []string{outbox, audit, paused},
			allowed: map[string][]string{
				outbox: {"find", "update", "listIndexes"}, paused: {"find", "insert", "remove"}, audit: {"find", "insert"},
			},
			required: map[string][]string{outbox: {"find", "update"}, audit: {"insert"}},
		},
	} {
		r, ok := roles[tc.role]
		if !ok {
			t.Errorf("deploy/mongodb/roles.js has no role %s", tc.role)
			continue
		}
		got := actionsByCollection(t, r, db)
		if !slices.Equal(collectionsOf(got), tc.collections) {
			t.Errorf("role %s covers %v, want exactly %v", tc.role, collectionsOf(got), tc.collections)
		}
		for c, actions := range got {
			for _, a := range actions {
				if !slices.Contains(tc.allowed[c], a) {
					t.Errorf("role %s may %s on %s, more than it needs (%v)", tc.role, a, c, tc.allowed[c])
				}
			}
		}
		for c, actions := range tc.required {
			for _, a := range actions {
				if !slices.Contains(got[c], a) {
					t.Errorf("role %s may not %s on %s, which it needs", tc.role, a, c)
				}
			}
		}
	}
}
