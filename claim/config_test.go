package claim

import (
	"strings"
	"testing"
	"time"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "WorkerID"},
		{Config{WorkerID: "w", BatchSize: -1}, "BatchSize -1"},
		{Config{WorkerID: "w", BatchSize: 10001}, "BatchSize 10001"},
		{Config{WorkerID: "w", MaxAttempts: -2}, "MaxAttempts -2"},
		{Config{WorkerID: "w", MaxBodyBytes: -1}, "MaxBodyBytes -1"},
		{Config{WorkerID: "w", PublishTimeout: -time.Second}, "PublishTimeout -1s"},
		{Config{WorkerID: "w", RetryMin: time.Minute, RetryMax: time.Second}, "RetryMax 1s: want at least RetryMin (1m0s)"},
		{Config{WorkerID: "w", Schedule: "bogus"}, `"bogus"`},
		{Config{WorkerID: "w", PublishTimeout: time.Minute, StaleAfter: time.Minute}, "StaleAfter 1m0s"},
	} {
		_, err := New(nil, nil, tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
	if _, err := New(nil, nil, Config{WorkerID: "w"}); err != nil {
		t.Errorf("New with only a worker id: %v, want the defaults to be valid", err)
	}
}
