package fleet_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/fleet"
)

func TestParseReadsEveryField(t *testing.T) {
	t.Parallel()
	got, err := fleet.Parse([]byte(`
outboxes:
  - name: orders
    mongo_uri: mongodb://db1:27017
    database: shop
    collection: outbox
    exchange: orders
    batch_size: 200
    claim_schedule: "@every 2s"
    claim_idle_max: 1m
    recovery_schedule: "*/5 * * * *"
    wake_on_insert: false
    max_attempts: 7
    ordering: none
    ordering_after_failed: continue
    message_format: cloudevents-binary
    cloudevents_source: /shop
    cloudevents_prefix: ce-
    retention: 24h
  - name: billing_2
    database: bill
    collection: outbox
    exchange: billing
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := []fleet.Outbox{{
		Name: "orders", Line: 3, MongoURI: "mongodb://db1:27017", Database: "shop", Collection: "outbox", Exchange: "orders",
		BatchSize: "200", ClaimSchedule: "@every 2s", ClaimIdleMax: "1m", RecoverySchedule: "*/5 * * * *", WakeOnInsert: "false", MaxAttempts: "7",
		Ordering: "none", OrderingAfterFailed: "continue", MessageFormat: "cloudevents-binary", CloudEventsSource: "/shop",
		CloudEventsPrefix: "ce-", Retention: "24h",
	}, {Name: "billing_2", Line: 20, Database: "bill", Collection: "outbox", Exchange: "billing"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	if n := len(got[0].Settings()); n != len(fleet.Fields()) {
		t.Errorf("an outbox that sets every field has %d settings, want %d (Fields)", n, len(fleet.Fields()))
	}
	wantSet := []fleet.Setting{{"database", "bill"}, {"collection", "outbox"}, {"exchange", "billing"}}
	if diff := cmp.Diff(wantSet, got[1].Settings()); diff != "" {
		t.Errorf("Settings (-want +got):\n%s", diff)
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	const ok = "    database: d\n    collection: c\n    exchange: e\n"
	for _, tc := range []struct {
		name, text string
		want       string // in the error
		outbox     string // the error's Outbox
		field      string // the error's Field
	}{
		{"empty file", "", "no outbox listed", "", ""},
		{"empty list", "outboxes: []\n", "no outbox listed", "", ""},
		{"unknown top-level field", "outbox:\n  - name: a\n", "field outbox not found", "", ""},
		{"misspelt setting", "outboxes:\n  - name: a\n" + ok + "    batchsize: 3\n", "field batchsize not found", "", ""},
		{"no name", "outboxes:\n  - database: d\n    collection: c\n    exchange: e\n", "required", "", "name"},
		{"upper-case name", "outboxes:\n  - name: Orders\n" + ok, "want lower-case letters", "Orders", "name"},
		{"name with a dot", "outboxes:\n  - name: a.b\n" + ok, "want lower-case letters", "a.b", "name"},
		{"long name", "outboxes:\n  - name: " + strings.Repeat("a", 33) + "\n" + ok, "longer than 32", strings.Repeat("a", 33), "name"},
		{"name twice", "outboxes:\n  - name: a\n" + ok + "  - name: a\n" + ok, "already the name of the outbox at line 2", "a", "name"},
		{"no database", "outboxes:\n  - name: a\n    collection: c\n    exchange: e\n", "required", "a", "database"},
		{"no exchange", "outboxes:\n  - name: a\n    database: d\n    collection: c\n", "required", "a", "exchange"},
		{"database and databases", "outboxes:\n  - name: a\n" + ok + "    databases: t_*\n", "want one of the two", "a", "databases"},
		{"bad pattern", "outboxes:\n  - name: a\n    databases: t_[\n    collection: c\n    exchange: e\n", "not a pattern", "a", "databases"},
		{"pattern with a slash", "outboxes:\n  - name: a\n    databases: t/*\n    collection: c\n    exchange: e\n", "no /", "a", "databases"},
		{"two documents", "outboxes:\n  - name: a\n" + ok + "---\noutboxes: []\n", "more than one YAML document", "", ""},
		{"a list where a value goes", "outboxes:\n  - name: a\n" + ok + "    batch_size: [1]\n", "cannot unmarshal", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := fleet.Parse([]byte(tc.text))
			var fe *fleet.Error
			if !errors.As(err, &fe) {
				t.Fatalf("Parse = %v, want a *fleet.Error", err)
			}
			if !strings.Contains(err.Error(), tc.want) || fe.Outbox != tc.outbox || fe.Field != tc.field {
				t.Errorf("Parse = %q (outbox %q, field %q), want %q of outbox %q, field %q", err, fe.Outbox, fe.Field, tc.want, tc.outbox, tc.field)
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte("outboxes:\n  - name: A\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := fleet.Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+": line 2: outbox \"A\": name: ") {
		t.Errorf("Load = %v, want an error that names the file, the line, the outbox and the field", err)
	}
	if _, err := fleet.Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file = %v, want os.ErrNotExist", err)
	}
}
