package mongo

import "time"

// SetSplitClaim chooses the claim's find strategy, so that the two-find
// claim MongoDB uses is tested on FerretDB too.
func SetSplitClaim(s *Store, split bool) { s.splitClaim = split }

// SetLocalClock replaces the local clock a Clock measures against, so that
// a test can skew it.
func SetLocalClock(c *Clock, local func() time.Time) { c.local = local }

// SetHeldWindow bounds Held's reads to n documents, so that a test reaches
// the bound with a few events.
func SetHeldWindow(s *Store, n int) { s.heldWindow = n }
