package testenv

import "testing"

func TestRequireDocker(t *testing.T) {
	t.Parallel()
	RequireDocker(t) // skips here when no engine answers; that is the point.
	if err := dockerHealth(t.Context()); err != nil {
		t.Fatalf("RequireDocker did not skip, but Docker is unhealthy: %v", err)
	}
}
