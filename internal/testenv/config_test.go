package testenv

import (
	"errors"
	"testing"
)

// errorCounter is a testing.TB that counts its Errorf calls.
type errorCounter struct {
	testing.TB
	errors int
}

func (*errorCounter) Helper()                 {}
func (c *errorCounter) Errorf(string, ...any) { c.errors++ }

func TestWantRefused(t *testing.T) {
	t.Parallel()
	build := func(n int) error {
		if n < 0 {
			return errors.New("demo: N -1: want 0 or more")
		}
		return nil
	}
	WantRefused(t, build, map[string]int{"N -1": -1})

	c := &errorCounter{TB: t}
	WantRefused(c, build, map[string]int{"N 1": 1, "N -2": -1})
	if c.errors != 2 {
		t.Errorf("WantRefused of an accepted Config and of an error without the want: %d errors, want 2", c.errors)
	}
}
