package testenv

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks, among the rest, that a Proxy (internal/tcpproxy, which
// has no tests of its own) leaves no goroutine behind once it is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, LeakOptions()...)
}

// TestLeakOptionsFindAnOrdinaryLeak: the options name only the servers'
// goroutines; a goroutine still blocked when the check runs is reported.
// Not parallel: parallel tests' goroutines would be reported too.
func TestLeakOptionsFindAnOrdinaryLeak(t *testing.T) {
	before := goleak.IgnoreCurrent()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		blockUntil(stop)
	}()
	err := goleak.Find(append(LeakOptions(), before)...)
	close(stop)
	<-done
	if err == nil || !strings.Contains(err.Error(), "testenv.blockUntil") {
		t.Errorf("goleak.Find with LeakOptions = %v, want the goroutine blocked in blockUntil reported", err)
	}
}

func blockUntil(stop <-chan struct{}) { <-stop }
