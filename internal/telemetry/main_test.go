package telemetry

import (
	"testing"

	"go.uber.org/goleak"
)

// The SDK's batch span processor and the exporter's HTTP client start
// goroutines: a provider a test did not shut down would leave them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
