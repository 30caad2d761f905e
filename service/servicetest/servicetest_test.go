package servicetest_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox/service/servicetest"
)

func TestArchetypeIsQuietAndOwnsItsMetrics(t *testing.T) {
	at := time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)
	a, b := servicetest.Archetype(func() time.Time { return at }), servicetest.Archetype(nil)
	if a.Logger.Enabled(t.Context(), 8) {
		t.Error("the logger is enabled at error level, want it to discard everything")
	}
	if a.Metrics == nil || a.Metrics == b.Metrics {
		t.Error("two Archetypes share their metrics, want a set each")
	}
	if got := a.Now(); !got.Equal(at) {
		t.Errorf("Now() = %s, want the test's clock %s", got, at)
	}
}
