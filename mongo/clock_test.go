package mongo_test

import (
	"context"
	"testing"
	"time"

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
		if d := clock.Now().Sub(time.Now()); d < -time.Second || d > time.Second {
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
