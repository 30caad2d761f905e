package fleet_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/fleet"
)

func TestParseReadsAPatternOfDatabases(t *testing.T) {
	t.Parallel()
	got, err := fleet.Parse([]byte("outboxes:\n  - name: tenants\n    databases: tenant_*\n    collection: outbox\n    exchange: ev\n"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := []fleet.Outbox{{Name: "tenants", Line: 2, Databases: "tenant_*", Collection: "outbox", Exchange: "ev"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
}

func TestMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, database string
		want              bool
	}{
		{"tenant_*", "tenant_a", true},
		{"tenant_*", "tenant_", true},
		{"tenant_*", "tenants", false},
		{"tenant_*", "other_tenant_a", false},
		{"tenant_?", "tenant_ab", false},
		{"tenant_[a-c]", "tenant_b", true},
		{"tenant_[a-c]", "tenant_d", false},
		{"*", "shop", true},
		{"*", "admin", false}, // MongoDB's own databases never match
		{"*", "local", false},
		{"conf*", "config", false},
		{"shop", "shop", true},
	} {
		if got := fleet.Matches(tc.pattern, tc.database); got != tc.want {
			t.Errorf("Matches(%q, %q) = %v, want %v", tc.pattern, tc.database, got, tc.want)
		}
	}
}

func TestDiscoveredName(t *testing.T) {
	t.Parallel()
	name, err := fleet.DiscoveredName("tenants", "tenant_a-1")
	if err != nil || name != "tenants/tenant_a-1" {
		t.Errorf("DiscoveredName = %q, %v, want tenants/tenant_a-1", name, err)
	}
	entry, db, ok := fleet.SplitDiscoveredName(name)
	if entry != "tenants" || db != "tenant_a-1" || !ok {
		t.Errorf("SplitDiscoveredName(%q) = %q, %q, %v", name, entry, db, ok)
	}
	if _, _, ok := fleet.SplitDiscoveredName("tenants"); ok {
		t.Error("SplitDiscoveredName of a configured name says it is discovered")
	}
	for _, db := range []string{"Tenant_A", "tenant.a", "tenant a", strings.Repeat("t", 64), ""} {
		if _, err := fleet.DiscoveredName("tenants", db); !errors.Is(err, fleet.ErrUnnameable) {
			t.Errorf("DiscoveredName(tenants, %q) = %v, want ErrUnnameable", db, err)
		}
	}
	long, err := fleet.DiscoveredName(strings.Repeat("e", fleet.NameMaxLength), strings.Repeat("d", fleet.DatabaseNameMaxLength))
	if err != nil || len(long) != fleet.DiscoveredNameMaxLength {
		t.Errorf("the longest discovered name: %d characters, %v; want %d", len(long), err, fleet.DiscoveredNameMaxLength)
	}
}
