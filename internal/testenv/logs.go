package testenv

import (
	"strings"
	"sync"
)

// LogBuffer collects what a logger writes from several goroutines, for a
// test to read back: slog.New(slog.NewTextHandler(&logs, nil)).
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
