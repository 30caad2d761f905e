package testenv

import (
	"context"
	"testing"
)

// Service is what Start starts: the relay's services all start and stop
// the same way.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Start starts svc and stops it in t.Cleanup, failing the test if either
// fails. Stop is idempotent, so a test may stop svc itself as well.
func Start(t testing.TB, svc Service) {
	t.Helper()
	if err := svc.Start(t.Context()); err != nil {
		t.Fatalf("Start %T: %v", svc, err)
	}
	t.Cleanup(func() {
		// Not t.Context(): that is canceled before cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("Stop %T: %v", svc, err)
		}
	})
}
