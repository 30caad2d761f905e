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

	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/schedule"
)

// ClockSyncDefault is how often a started Clock measures the server's time
// again once it has.
const ClockSyncDefault = time.Minute

// clockRetry is how often a started Clock tries again while it has never
// measured the server's time: partitions are taken only once it has (see
// Synced), so a worker whose first measurement failed waits seconds for
// the next one, not a minute.
const clockRetry = 2 * time.Second

// Clock is the database server's time as seen from this process. Events
// carry times written by many machines (createdAt by producers,
// processingAt and lease expiries by every replica); ages and expiries
// computed against one clock, the server's, cannot go negative or disagree
// between replicas because one machine's clock is off.
//
// A Sync reads the server's time with the hello command, whose reply
// carries the server's localTime (MongoDB and FerretDB alike), and keeps it
// together with the local instant it was most likely read at, the midpoint
// of the round trip (its error is at most half the round trip, which
// Uncertainty reports). Now is that server time plus the time that has
// passed since, measured on the local monotonic clock: a step of the local
// wall clock (NTP, an operator) between two syncs moves nothing. Only the
// rate of the local clock matters between syncs, a few parts per million.
type Clock struct {
	client *mongo.Client
	logger *slog.Logger
	// wall is the local wall clock (for Offset, and Now before the first
	// Sync); mono measures intervals. Both are time.Now, whose Sub uses the
	// monotonic reading; tests set them apart (fakeclock).
	wall, mono func() time.Time

	mu sync.Mutex
	// syncServer is the server's time at the local instant syncLocal (a
	// reading of mono) of the last Sync, and syncWall the wall clock then.
	syncServer, syncLocal, syncWall time.Time
	uncertainty                     time.Duration
	roundTrip                       time.Duration // the shortest of the last Sync
	synced                          bool
	lastSync                        time.Time // mono, of the last success
	failures                        int       // in a row, while never synced
	// retryAt (mono) is when a clock that was measured before tries
	// again after failed measurements, again how many failed in a row:
	// the wait doubles from clockRetry up to ClockSyncDefault (see
	// resync).
	retryAt time.Time
	again   int

	job *schedule.Job // measures again every ClockSyncDefault (clockRetry until synced)

	// onJump are told the jump of every measurement but the first (see
	// OnJump).
	onJump []func(jump time.Duration)
}

// NewClock returns a Clock that reads the time of client's server. Until
// the first Sync it reports the local time, and Synced is false.
func NewClock(client *mongo.Client, logger *slog.Logger) *Clock {
	c := &Clock{client: client, logger: cmp.Or(logger, slog.Default()), wall: time.Now, mono: time.Now}
	job, err := schedule.New(schedule.Config{Name: "clock", Schedule: "@every " + clockRetry.String(), Run: c.resync, Logger: c.logger})
	if err != nil {
		panic(err) // a constant Config: a bug
	}
	c.job = job
	return c
}

// Now is the server's time as best known: the server's time at the last
// Sync plus the monotonic time since; the local wall clock before the
// first Sync.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	synced, server, local := c.synced, c.syncServer, c.syncLocal
	c.mu.Unlock()
	if !synced {
		return c.wall()
	}
	return server.Add(c.mono().Sub(local))
}

// Offset is the server's time minus the local wall clock's at the last
// Sync, and the most the measurement can be off by; both zero before the
// first Sync. Now does not use it: it counts from the Sync on the monotonic
// clock.
func (c *Clock) Offset() (offset, uncertainty time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.synced {
		return 0, 0
	}
	return c.syncServer.Sub(c.syncWall), c.uncertainty
}

// RoundTrip returns the shortest round trip of the last measurement: a
// hello, the least a command costs. 0 before the first.
func (c *Clock) RoundTrip() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roundTrip
}

// Synced reports whether the server's time has been measured: before that
// Now is this machine's wall clock, which no decision that other replicas
// must agree with may rest on (ownership takes no partition until then).
func (c *Clock) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// Sync measures the server's time once. Of several measurements the one
// with the shortest round trip is kept, as it bounds the error most
// tightly. They are taken one after another, on one connection where the
// pool has it: taken at once, each opened a connection of its own, whose
// handshake counted in every round trip and tripled the uncertainty.
func (c *Clock) Sync(ctx context.Context) error {
	var best clockSample
	for i := range clockSamples {
		s := c.sample(ctx)
		if s.err != nil {
			return s.err
		}
		if i == 0 || s.rtt < best.rtt {
			best = s
		}
	}
	c.keep(best)
	return nil
}

// clockSamples is how many measurements one Sync takes.
const clockSamples = 3

// clockSample is one reading of the server's time: localTime, and the
// local instants (monotonic and wall) it was most likely read at.
type clockSample struct {
	server, local, wall time.Time
	rtt                 time.Duration
	err                 error
}

// sample reads the server's time once.
func (c *Clock) sample(ctx context.Context) clockSample {
	sent, sentWall := c.mono(), c.wall()
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	err := c.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello)
	rtt := c.mono().Sub(sent)
	if err != nil {
		return clockSample{err: fmt.Errorf("read the server's time (hello): %w", err)}
	}
	if hello.LocalTime.IsZero() {
		return clockSample{err: fmt.Errorf("read the server's time (hello): the reply has no localTime")}
	}
	// localTime has millisecond resolution; the midpoint is the most
	// likely local instant it was read at.
	return clockSample{server: hello.LocalTime, local: sent.Add(rtt / 2), wall: sentWall.Add(rtt / 2), rtt: rtt}
}

// OnJump registers f to be told, at every measurement after the first,
// how far the server's time it found is from the time the measurement
// before predicted for that moment (the old server time plus the
// monotonic time since): a jump of the offset, after a failover to a node
// whose clock differs or a step of the server's clock, and otherwise the
// two measurements' small errors. f runs before Now moves to the new
// measurement, so that what it stops (claims in partitions, recovery) is
// stopped before a decision rests on the new time. Call it before Start.
func (c *Clock) OnJump(f func(jump time.Duration)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onJump = append(c.onJump, f)
}

// keep makes s the clock's measurement, first telling OnJump's listeners
// how far it moved the server's time.
func (c *Clock) keep(s clockSample) {
	server, local, wall, best := s.server, s.local, s.wall, s.rtt
	c.mu.Lock()
	measured, listeners := c.synced, c.onJump
	jump := server.Sub(c.syncServer.Add(local.Sub(c.syncLocal)))
	c.mu.Unlock()
	if measured {
		for _, f := range listeners {
			f(jump)
		}
	}
	c.mu.Lock()
	offset := server.Sub(wall)
	changed := !c.synced || absDuration(offset-c.syncServer.Sub(c.syncWall)) > time.Second
	c.syncServer, c.syncLocal, c.syncWall = server, local, wall
	c.uncertainty, c.roundTrip, c.synced, c.lastSync, c.failures, c.again = best/2+time.Millisecond, best, true, c.mono(), 0, 0
	c.mu.Unlock()
	if changed {
		c.logger.Info("database clock offset measured",
			"offset", offset.Round(time.Millisecond).String(),
			"uncertainty", (best/2 + time.Millisecond).Round(time.Millisecond).String())
	}
}

// Start measures the server's time again every ClockSyncDefault until
// Stop, and every clockRetry while it never has. The first measurement is
// Sync's, which the caller runs when it needs one.
func (c *Clock) Start(ctx context.Context) error { return c.job.Start(ctx) }

// Stop ends the periodic measurement. Idempotent; safe before Start.
func (c *Clock) Stop(ctx context.Context) error { return c.job.Stop(ctx) }

// resync is one periodic measurement, when one is due. One that fails
// keeps the last measurement, which is still the best known: a warning,
// not a failed job. While none ever succeeded, the warning comes at the
// 1st, 2nd, 4th, 8th... failure.
func (c *Clock) resync(ctx context.Context) (bool, error) {
	c.mu.Lock()
	now := c.mono()
	due := !c.synced || (now.Sub(c.lastSync) >= ClockSyncDefault-clockRetry/2 && !now.Before(c.retryAt))
	c.mu.Unlock()
	if !due {
		return false, nil
	}
	syncCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := c.Sync(syncCtx)
	if err == nil || ctx.Err() != nil {
		return false, nil
	}
	c.mu.Lock()
	synced := c.synced
	if !synced {
		c.failures++
	} else {
		// The last measurement stands; measuring again every clockRetry
		// was a hello per outbox every 2 s against a database too slow to
		// answer one: 19 a second from 200 outboxes on FerretDB, which
		// kept it too slow.
		c.again++
		c.retryAt = c.mono().Add(backoff.Delay(c.again-1, clockRetry, ClockSyncDefault))
	}
	n := c.failures
	c.mu.Unlock()
	switch {
	case synced:
		c.logger.Warn("database clock not measured again; keeping the last measurement", "error", err)
	case n&(n-1) == 0:
		c.logger.Warn("database clock still not measured; no partition is taken until it is", "failures", n, "error", err)
	}
	return false, nil
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
