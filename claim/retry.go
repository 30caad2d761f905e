package claim

import (
	"math/rand/v2"
	"time"
)

const (
	// RetryMinDefault is the delay before the first retry of a failed publish.
	RetryMinDefault = time.Second
	// RetryMaxDefault caps the delay between retries.
	RetryMaxDefault = 5 * time.Minute
)

// retryDelay is the wait before the next claim of an event whose publish
// failed on its n-th attempt: RetryMin doubled for each attempt after the
// first, capped at RetryMax, then jittered down by up to half so that
// batches and replicas that failed together do not retry together (the
// events of one batch share a delay, so that their release is one write).
func retryDelay(n int, lo, hi time.Duration, jitter func(time.Duration) time.Duration) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d - jitter(d/2)
}

// randomJitter returns a random duration in [0, d].
func randomJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}
