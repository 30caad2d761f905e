//go:build race

package plan_test

// raceEnabled says the race detector is on: the property test then runs
// a tenth of its lanes, which race with nothing (the plan is pure).
const raceEnabled = true
