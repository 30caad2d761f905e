package mongo_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/internal/fakeclock"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

func TestClockCorrectsASkewedLocalClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-7 * time.Minute, 3 * time.Hour} {
		clock := mongo.NewClock(testenv.Client(t), nil)
		mongo.SetLocalClock(clock, func() time.Time { return time.Now().Add(skew) })
		if clock.Synced() {
			t.Fatal("Synced before Sync")
		}
		if err := clock.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		offset, uncertainty := clock.Offset()
		// The server runs on this machine: its clock is the real one, so the
		// measured offset undoes the skew, within the measurement's error
		// and the server's millisecond resolution.
		if got := offset + skew; got < -uncertainty-time.Millisecond || got > uncertainty+time.Millisecond {
			t.Errorf("skew %s: offset %s (±%s) does not undo it", skew, offset, uncertainty)
		}
		if d := time.Until(clock.Now()); d < -time.Second || d > time.Second {
			t.Errorf("skew %s: Now is %s from the server's time", skew, d)
		}
	}
}

func TestClockStopBeforeStart(t *testing.T) {
	t.Parallel()
	clock := mongo.NewClock(testenv.Client(t), nil)
	if err := clock.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := clock.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// After a Sync the server's time runs on the monotonic clock: a step of
// the local wall clock (NTP, an operator's date command), forward or back,
// moves nothing, while the time that passes moves it one for one. Before,
// Now was the wall clock plus the offset, and a step of an hour moved the
// server's time an hour: terms taken early, healthy claims recovered.
func TestClockIgnoresAWallClockStepAfterASync(t *testing.T) {
	t.Parallel()
	fake := fakeclock.New(time.Now().Add(-3 * time.Hour)) // the local clock is off too
	clock := mongo.NewClock(testenv.Client(t), nil)
	mongo.SetFakeClock(clock, fake)
	if err := clock.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	synced := clock.Now()
	if d := time.Until(synced); d < -time.Second || d > time.Second {
		t.Fatalf("Now after the Sync is %s from the server's time", d)
	}
	for _, step := range []time.Duration{time.Hour, -2 * time.Hour, 30 * time.Second} {
		fake.Step(step)
		if got := clock.Now(); !got.Equal(synced) {
			t.Errorf("after a wall-clock step of %s: Now moved by %s, want 0", step, got.Sub(synced))
		}
	}
	fake.Advance(5 * time.Second)
	if got := clock.Now().Sub(synced); got != 5*time.Second {
		t.Errorf("5 s after the Sync: Now moved by %s, want 5s", got)
	}
	// The offset reports the wall clock as it was at the Sync.
	if offset, _ := clock.Offset(); offset < 3*time.Hour-time.Second || offset > 3*time.Hour+time.Second {
		t.Errorf("Offset = %s, want about 3h", offset)
	}
}

// Until the first Sync the clock says it has not measured anything, and
// Now is the local wall clock.
func TestClockUnsyncedUntilTheFirstSync(t *testing.T) {
	t.Parallel()
	fake := fakeclock.New(time.Now().Add(time.Hour))
	clock := mongo.NewClock(testenv.Client(t), nil)
	mongo.SetFakeClock(clock, fake)
	if clock.Synced() {
		t.Fatal("Synced before any Sync")
	}
	if got := clock.Now(); !got.Equal(fake.Now()) {
		t.Errorf("Now before a Sync = %s, want the wall clock %s", got, fake.Now())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := clock.Sync(ctx); err == nil {
		t.Fatal("Sync with a cancelled context succeeded")
	}
	if clock.Synced() {
		t.Error("Synced after a failed Sync")
	}
	if err := clock.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !clock.Synced() {
		t.Error("not Synced after a Sync")
	}
}

// A measurement tells OnJump how far the server's time moved from what the
// last one predicted: about nothing while the clocks keep their rates, and
// the jump when the time found moves (here the local monotonic clock,
// which the prediction runs on, loses 10 s: the server's time seems 10 s
// ahead, as after a failover to a node whose clock is ahead). The first
// measurement predicts nothing and tells nothing.
func TestClockReportsAJumpOfTheOffset(t *testing.T) {
	t.Parallel()
	var skew atomic.Int64
	clock := mongo.NewClock(testenv.Client(t), nil)
	mongo.SetLocalClock(clock, func() time.Time { return time.Now().Add(time.Duration(skew.Load())) })
	var jumps []time.Duration
	clock.OnJump(func(d time.Duration) { jumps = append(jumps, d) })
	for range 2 {
		if err := clock.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if len(jumps) != 1 || jumps[0] < -time.Second || jumps[0] > time.Second {
		t.Fatalf("jumps after two measurements = %v, want one of about 0", jumps)
	}
	skew.Store(int64(-10 * time.Second))
	if err := clock.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(jumps) != 2 || jumps[1] < 9*time.Second || jumps[1] > 11*time.Second {
		t.Errorf("jumps after the local clock lost 10 s = %v, want a second one of about +10s", jumps)
	}
}

// A clock measured before whose next measurements fail keeps its last one
// and tries again less and less often (clockRetry doubling up to
// ClockSyncDefault), rather than every clockRetry: a database too slow to
// answer was sent a hello per outbox every 2 s, which kept it slow.
func TestClockBacksOffMeasuringAgain(t *testing.T) {
	t.Parallel()
	client, err := driver.Connect(options.Client().ApplyURI(testenv.MongoURI(t)).SetMaxPoolSize(2))
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	fake := fakeclock.New(time.Now())
	clock := mongo.NewClock(client, slog.New(slog.NewTextHandler(&logs, nil)))
	mongo.SetFakeClock(clock, fake)
	if err := clock.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := client.Disconnect(t.Context()); err != nil { // every measurement fails from now
		t.Fatal(err)
	}
	// Ten minutes of the schedule's 2 s ticks, from when a measurement
	// falls due.
	fake.Advance(mongo.ClockSyncDefault)
	for range 300 {
		mongo.ResyncClock(t.Context(), clock)
		fake.Advance(2 * time.Second)
	}
	tries := strings.Count(logs.String(), "not measured again")
	// 2, 4, 8, 16, 32 s, then a minute apart: 14 in ten minutes.
	if tries < 2 || tries > 16 {
		t.Errorf("%d measurements tried in 10 minutes of failures, want about 14 (300 at every tick); log:\n%s", tries, logs.String())
	}
	if !clock.Synced() {
		t.Error("not Synced after failed measurements: the last one stands")
	}
}
