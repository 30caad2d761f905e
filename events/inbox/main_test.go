package inbox

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test started must be gone when the tests end: the
// servers are other processes here, so nothing is left running on
// purpose.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
