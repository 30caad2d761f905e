package testenv

import (
	"context"
	"testing"
)

// fakeService counts its starts and stops.
type fakeService struct{ starts, stops int }

func (f *fakeService) Start(context.Context) error { f.starts++; return nil }
func (f *fakeService) Stop(context.Context) error  { f.stops++; return nil }

func TestStartStopsAtCleanup(t *testing.T) {
	t.Parallel()
	svc := &fakeService{}
	t.Run("test", func(t *testing.T) {
		Start(t, svc)
		if svc.starts != 1 || svc.stops != 0 {
			t.Errorf("during the test: %d starts, %d stops; want 1, 0", svc.starts, svc.stops)
		}
	})
	if svc.starts != 1 || svc.stops != 1 {
		t.Errorf("after the test: %d starts, %d stops; want 1, 1", svc.starts, svc.stops)
	}
}
