package ferret

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain takes no options from internal/testenv (which imports this
// package): these tests start no FerretDB, so nothing may outlive them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
