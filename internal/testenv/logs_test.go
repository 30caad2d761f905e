package testenv

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

func TestLogBufferKeepsConcurrentWrites(t *testing.T) {
	t.Parallel()
	var logs LogBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				logger.Info("line")
			}
		})
	}
	wg.Wait()
	if n := strings.Count(logs.String(), "msg=line\n"); n != 800 {
		t.Errorf("%d whole lines, want 800", n)
	}
}
