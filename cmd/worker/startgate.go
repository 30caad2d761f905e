package main

import "context"

// startsAtOnce bounds how many outboxes prepare their collections and
// indexes at once. 200 outboxes starting together sent 200 attempts of
// several commands each at one database; each took longer than its 10 s
// and was tried again, and the worker was not ready after minutes on
// embedded FerretDB. A handful at a time, each attempt finishes.
const startsAtOnce = 8

// startGate lets a bounded number of start-up attempts run at once. A
// slot is held for one attempt, not for an outbox's whole start: an
// outbox whose database is down waits between its attempts without a
// slot, and the others start.
type startGate chan struct{}

func newStartGate(n int) startGate { return make(startGate, n) }

// attempt runs fn in a slot, once one is free or ctx has ended (then it
// returns ctx's error without running fn). A nil gate runs fn at once.
func (g startGate) attempt(ctx context.Context, fn func(context.Context) error) error {
	if g == nil {
		return fn(ctx)
	}
	select {
	case g <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-g }()
	return fn(ctx)
}
