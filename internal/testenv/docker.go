package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

const dockerCheckTimeout = 15 * time.Second

// RequireDocker skips the test when no Docker engine answers, as found by
// testcontainers-go (DOCKER_HOST, Docker contexts, ~/.testcontainers.properties,
// the default sockets). It is the only helper in this package that skips:
// the container suite runs where Docker exists.
func RequireDocker(t testing.TB) {
	t.Helper()
	if err := checkDocker(t.Context()); err != nil {
		t.Skipf("Docker engine not available: %v; the container suite runs where Docker exists", err)
	}
}

// checkDocker is dockerHealth, or a stand-in in this package's tests.
var checkDocker = dockerHealth

func dockerHealth(ctx context.Context) (err error) {
	// testcontainers-go panics on some broken Docker configurations.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, dockerCheckTimeout)
	defer cancel()

	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return err
	}
	defer provider.Close() //nolint:errcheck // nothing to do about a failed close.
	return provider.Health(ctx)
}
