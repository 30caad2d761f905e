package ownership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/service"
)

// A give-back does not free a partition while a claim write of its owner
// may still land: a claim's write in partition 7 ended without an answer
// (a timeout: the server may still apply it), and a gives everything back
// at once. The partitions with no write in doubt are free at once; 7 two
// margins later (the write's tail, and the two clocks' errors): a new
// owner that read 7's events as NEW while a's late write took the first of
// an aggregate would otherwise claim and publish the second ahead of it.
func TestGiveBackWaitsForAWriteInDoubt(t *testing.T) {
	t.Parallel()
	clock, a, b := startWithNewcomer(t)
	wrote(a, []int{7}, context.DeadlineExceeded)
	release(t, a)
	tick(t, b)
	if got := holding(b); got[7] || len(got) != events.Partitions-1 {
		t.Errorf("b at once after a's give-back holds 7: %t, %d partitions; want not 7, every other one", got[7], len(got))
	}
	clock.Advance(2*a.cfg.Margin - time.Millisecond)
	tick(t, b)
	if holding(b)[7] {
		t.Error("b holds 7 less than two margins after a's give-back with a write in doubt")
	}
	clock.Advance(2 * time.Millisecond)
	tick(t, b)
	if !holding(b)[7] {
		t.Error("b does not hold 7 two margins after a's give-back")
	}
}

// The doubt lasts a margin from the write's end (the tail of a write the
// server carries on with, as the time fence allows for it): a give-back
// after that frees the partition at once again.
func TestWriteInDoubtLastsAMargin(t *testing.T) {
	t.Parallel()
	clock, a, b := startWithNewcomer(t)
	wrote(a, []int{7}, context.DeadlineExceeded)
	wrote(a, []int{8}, nil) // a write that answered has landed
	clock.Advance(a.cfg.Margin + time.Millisecond)
	release(t, a)
	tickTakesAll(t, b, "after a's give-back a margin past the write")
}

// A claim the database's fence refused drops its partition at once, and
// the next term of it is numbered above the fence: after a dropped owners
// collection the terms restart below the fences, and a holder that kept
// the partition had every claim refused and never let go.
func TestFencedPartitionIsTakenAboveTheFence(t *testing.T) {
	t.Parallel()
	_, _, a := startAlone(t)
	wrote(a, nil, &events.FencedError{Fences: map[int]int64{7: 57}})
	terms, _, done := a.Hold()
	done()
	if terms[7] != 0 {
		t.Errorf("a may still claim in 7 under tenure %d after the fence refused it", terms[7])
	}
	tick(t, a)
	terms, _, done = a.Hold()
	done()
	if terms[7] <= 57 {
		t.Errorf("a's tenure of 7 after its next round = %d, want above the fence's 57", terms[7])
	}
	if terms[8] != 1 {
		t.Errorf("a's tenure of 8 = %d, want 1: only the refused partition changes hands", terms[8])
	}
}

// A jump of the database clock's offset larger than a margin counts as
// losing every partition for a term: b's clock jumps ahead by four margins
// (a failover to a node whose clock is ahead) while a, paused, still
// claims under its own monotonic deadline. b sees a's terms end early; it
// must not take them while a's Hold still hands them out.
func TestClockJumpTakesNothingForATerm(t *testing.T) {
	t.Parallel()
	table, clock, a := startAlone(t)
	margin := a.cfg.Margin
	var jump time.Duration
	b, err := New(table, Config{WorkerID: "b", TermLength: term, Archetype: service.Archetype{
		Now: func() time.Time { return clock.Now().Add(jump) }, Local: clock.Now, Logger: a.cfg.Logger}})
	if err != nil {
		t.Fatal(err)
	}
	tick(t, b) // b runs, and owns nothing: a holds every partition
	clock.Advance(term - 5*margin/2)
	_, valid, done := a.Hold()
	done()
	if valid <= 0 {
		t.Fatal("a's Hold hands nothing out: the test does not test the case")
	}
	jump = 4 * margin
	b.ClockJumped(small(margin))
	b.ClockJumped(jump)
	tick(t, b)
	if n := checkDisjoint(t, a, b); len(holding(b)) != 0 {
		t.Errorf("b after its clock jumped by %s holds %d partitions (%d held once), want none for a term", jump, len(holding(b)), n)
	}
	// A term after the jump, a's terms have run out by every clock: b takes.
	clock.Advance(term)
	tickTakesAll(t, b, "a term after the jump")
}

// small is a jump within the margin, which the fence's margins cover.
func small(margin time.Duration) time.Duration { return margin / 2 }

// A jump within the margin costs nothing.
func TestSmallClockJumpKeepsThePartitions(t *testing.T) {
	t.Parallel()
	_, _, a := startAlone(t)
	a.ClockJumped(-small(a.cfg.Margin))
	if n := len(holding(a)); n != events.Partitions {
		t.Errorf("a after a jump within the margin holds %d, want all %d", n, events.Partitions)
	}
	a.ClockJumped(-2 * a.cfg.Margin)
	if n := len(holding(a)); n != 0 {
		t.Errorf("a after a jump of two margins back holds %d, want none", n)
	}
}

// TestWriteInDoubtLastsUntilItsDeadline a write whose
// error came back early (a broken connection, 10 margins before its
// deadline) may still be applied by the server until its deadline, which
// the driver sent as maxTimeMS: a give-back does not free its partition
// until a margin past that. Before: the doubt counted a margin from the
// error, and b took partition 7 while the write could still land.
func TestWriteInDoubtLastsUntilItsDeadline(t *testing.T) {
	t.Parallel()
	clock, a, b := startWithNewcomer(t)
	_, _, done := a.Hold()
	a.Wrote([]int{7}, 10*a.cfg.Margin, errors.New("connection reset"))
	done()
	clock.Advance(3 * a.cfg.Margin)
	release(t, a)
	tick(t, b)
	if holding(b)[7] {
		t.Error("b holds 7 three margins after a's write failed early, with its deadline seven margins away")
	}
	clock.Advance(8*a.cfg.Margin + time.Millisecond)
	tick(t, b)
	if !holding(b)[7] {
		t.Error("b does not hold 7 a margin past the deadline of a's write")
	}
}
