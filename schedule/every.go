package schedule

import (
	"context"
	"time"
)

// Every calls run every d until ctx ends: for a periodic chore that needs
// none of a Job's machinery (cron schedules, Trigger, drains, backoff
// after failures, logs). run gets ctx; a run in flight when ctx ends
// finishes before Every returns.
func Every(ctx context.Context, d time.Duration, run func(ctx context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A select picks at random among ready cases: a tick that is
		// ready when ctx ends must not start a run.
		if ctx.Err() != nil {
			return
		}
		run(ctx)
	}
}
