package mongo

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/schedule"
)

// ClockSyncDefault is how often a started Clock measures its offset again.
const ClockSyncDefault = time.Minute

// Clock is the database server's time as seen from this process: the local
// clock plus a measured offset. Events carry times written by many machines
// (createdAt by producers, processingAt and lease expiries by every
// replica); ages and expiries computed against one clock, the server's,
// cannot go negative or disagree between replicas because one machine's
// clock is off.
//
// The offset is measured with the hello command, whose reply carries the
// server's localTime (MongoDB and FerretDB alike), as the server time minus
// the midpoint of the round trip. Its error is at most half the round trip,
// which Uncertainty reports.
type Clock struct {
	client *mongo.Client
	logger *slog.Logger
	local  func() time.Time

	mu          sync.Mutex
	offset      time.Duration
	uncertainty time.Duration
	synced      bool

	job *schedule.Job // measures the offset again every ClockSyncDefault
}

// NewClock returns a Clock that reads the time of client's server. Until
// the first Sync it reports the local time.
func NewClock(client *mongo.Client, logger *slog.Logger) *Clock {
	c := &Clock{client: client, logger: cmp.Or(logger, slog.Default()), local: time.Now}
	job, err := schedule.New(schedule.Config{Name: "clock", Schedule: "@every " + ClockSyncDefault.String(), Run: c.resync, Logger: c.logger})
	if err != nil {
		panic(err) // a constant Config: a bug
	}
	c.job = job
	return c
}

// Now is the server's time as best known.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	off := c.offset
	c.mu.Unlock()
	return c.local().Add(off)
}

// Offset is the server's time minus the local time, and the most the
// measurement can be off by; both zero before the first Sync.
func (c *Clock) Offset() (offset, uncertainty time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset, c.uncertainty
}

// Synced reports whether an offset has been measured.
func (c *Clock) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// Sync measures the offset once. Of several measurements the one with the
// shortest round trip is kept, as it bounds the error most tightly.
func (c *Clock) Sync(ctx context.Context) error {
	best := time.Duration(-1)
	var bestOffset time.Duration
	for range 3 {
		sent := c.local()
		var hello struct {
			LocalTime time.Time `bson:"localTime"`
		}
		err := c.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello)
		received := c.local()
		if err != nil {
			return fmt.Errorf("read the server's time (hello): %w", err)
		}
		if hello.LocalTime.IsZero() {
			return fmt.Errorf("read the server's time (hello): the reply has no localTime")
		}
		rtt := received.Sub(sent)
		if best < 0 || rtt < best {
			best = rtt
			// localTime has millisecond resolution; the midpoint is the
			// most likely local instant it was read at.
			bestOffset = hello.LocalTime.Sub(sent.Add(rtt / 2))
		}
	}
	c.mu.Lock()
	changed := !c.synced || absDuration(bestOffset-c.offset) > time.Second
	c.offset, c.uncertainty, c.synced = bestOffset, best/2+time.Millisecond, true
	c.mu.Unlock()
	if changed {
		c.logger.Info("database clock offset measured",
			"offset", bestOffset.Round(time.Millisecond).String(),
			"uncertainty", (best/2 + time.Millisecond).Round(time.Millisecond).String())
	}
	return nil
}

// Start measures the offset again every ClockSyncDefault until Stop. The
// first measurement is Sync's, which the caller runs when it needs one.
func (c *Clock) Start(ctx context.Context) error { return c.job.Start(ctx) }

// Stop ends the periodic measurement. Idempotent; safe before Start.
func (c *Clock) Stop(ctx context.Context) error { return c.job.Stop(ctx) }

// resync is one periodic measurement. One that fails keeps the last
// offset, which is still the best known: a warning, not a failed job.
func (c *Clock) resync(ctx context.Context) (bool, error) {
	syncCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Sync(syncCtx); err != nil && ctx.Err() == nil {
		c.logger.Warn("database clock offset not measured; keeping the last one", "error", err)
	}
	return false, nil
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
