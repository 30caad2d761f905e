//go:build !race

package plan_test

const raceEnabled = false
