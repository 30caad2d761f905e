package main

import "testing"

// TestGCFloorYieldsToTheEnvironment checks that GOGC or GOMEMLIMIT in the
// environment leaves the collector to them.
func TestGCFloorYieldsToTheEnvironment(t *testing.T) {
	for _, env := range []map[string]string{{"GOGC": "200"}, {"GOMEMLIMIT": "1GiB"}, {"GOGC": "off"}} {
		if f := startGCFloor(func(k string) string { return env[k] }); f != nil {
			f.Stop()
			t.Errorf("environment %v: the floor started", env)
		}
	}
	f := startGCFloor(func(string) string { return "" })
	if f == nil {
		t.Fatal("no floor without GOGC or GOMEMLIMIT")
	}
	f.Stop()
}
