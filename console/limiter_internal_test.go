package console

import (
	"fmt"
	"testing"
	"time"
)

// TestLimiterFloodKeepsBlocks: a flood of new keys does not free a key
// that is over its limit: the oldest keys not over it make room.
func TestLimiterFloodKeepsBlocks(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	l := newLimiter(2, time.Minute, func() time.Time { return at })
	l.allow("attacker")
	l.allow("attacker")
	if !l.blocked("attacker") {
		t.Fatal("attacker not blocked after 2 of 2")
	}
	for i := range limiterKeys + 10 {
		l.allow(fmt.Sprintf("flood-%d", i))
	}
	if !l.blocked("attacker") {
		t.Error("a flood of new keys freed the blocked key")
	}
	if n := l.size(); n > limiterKeys {
		t.Errorf("the limiter holds %d keys, more than %d", n, limiterKeys)
	}
}

// TestSignInBlocksGrow: a key that reaches its limit again after a
// block waits twice as long.
func TestSignInBlocksGrow(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	l := newLimiter(2, time.Minute, func() time.Time { return at }).growing()
	strike := func() {
		t.Helper()
		l.allow("k")
		l.allow("k")
		if !l.blocked("k") {
			t.Fatal("not blocked after 2 of 2")
		}
	}
	strike()
	at = at.Add(time.Minute)
	if l.blocked("k") {
		t.Fatal("still blocked after the first minute")
	}
	strike()
	at = at.Add(time.Minute)
	if !l.blocked("k") {
		t.Error("a second strike was blocked for a minute only, want two")
	}
	at = at.Add(time.Minute)
	if l.blocked("k") {
		t.Error("a second strike was blocked past two minutes")
	}
}
