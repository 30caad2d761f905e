//go:build !race

package scripts

const raceEnabled = false
