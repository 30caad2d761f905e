package workerproc

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}
