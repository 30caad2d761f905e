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
		{Config{}, "worker id"},
		{Config{WorkerID: "w", BatchSize: -1}, "batch size -1"},
		{Config{WorkerID: "w", BatchSize: 10001}, "batch size 10001"},
		{Config{WorkerID: "w", MaxAttempts: -2}, "max attempts -2"},
		{Config{WorkerID: "w", MaxBodyBytes: -1}, "max body bytes -1"},
		{Config{WorkerID: "w", PublishTimeout: -time.Second}, "publish timeout -1s"},
		{Config{WorkerID: "w", RetryMin: time.Minute, RetryMax: time.Second}, "retry backoff 1m0s..1s"},
		{Config{WorkerID: "w", Schedule: "bogus"}, `"bogus"`},
		{Config{WorkerID: "w", PublishTimeout: time.Minute, StaleAfter: time.Minute}, "stale after 1m0s"},
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
