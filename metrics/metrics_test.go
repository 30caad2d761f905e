package metrics_test

import (
	"testing"

	"github.com/outboxrelay/outbox/metrics"
)

func TestOrNew(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	if got := metrics.OrNew(m); got != m {
		t.Errorf("OrNew(m) = %p, want m itself (%p)", got, m)
	}
	if got := metrics.OrNew(nil); got == nil || got.Claimed == nil {
		t.Errorf("OrNew(nil) = %+v, want a new set with its collectors", got)
	}
}
