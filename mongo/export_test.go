package mongo

// SetSplitClaim chooses the claim's find strategy, so that the two-find
// claim MongoDB uses is tested on FerretDB too.
func SetSplitClaim(s *Store, split bool) { s.splitClaim = split }
