//go:build race

package check

// raceEnabled: under the race detector (make test runs ./claim/... again
// with -race) the checker, one goroutine, has nothing to race, and runs a
// tenth of its seeds.
const raceEnabled = true
