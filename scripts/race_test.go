//go:build race

package scripts

// raceEnabled says the race detector is on: the public module's tests
// then run under it too (make test's race pass).
const raceEnabled = true
