package events

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStatuses(t *testing.T) {
	t.Parallel()

	want := []Status{StatusNew, StatusProcessing, StatusPublished, StatusFailed}
	if diff := cmp.Diff(want, Statuses); diff != "" {
		t.Errorf("Statuses (-want +got):\n%s", diff)
	}
	// Counting adds the unknown label after the statuses, and leaves
	// Statuses alone (CountedStatuses must not share its array).
	if diff := cmp.Diff(append(want, StatusUnknown), CountedStatuses); diff != "" {
		t.Errorf("CountedStatuses (-want +got):\n%s", diff)
	}
	if _, err := ParseStatus(string(StatusUnknown)); err == nil {
		t.Errorf("ParseStatus(%q) succeeded; the unknown label is not a status", StatusUnknown)
	}
}

func TestCanTransition(t *testing.T) {
	t.Parallel()

	type edge struct{ From, To Status }
	// Every allowed edge of the lifecycle; every other pair, self-transitions
	// included, must be refused.
	allowed := map[edge]bool{
		{StatusNew, StatusProcessing}:       true, // claim
		{StatusProcessing, StatusPublished}: true, // confirm
		{StatusProcessing, StatusNew}:       true, // release or stale reset
		{StatusProcessing, StatusFailed}:    true, // poison or max attempts
		{StatusFailed, StatusNew}:           true, // operator requeue
	}

	for _, from := range Statuses {
		for _, to := range Statuses {
			t.Run(string(from)+"->"+string(to), func(t *testing.T) {
				t.Parallel()
				want := allowed[edge{from, to}]
				if got := CanTransition(from, to); got != want {
					t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
				}
			})
		}
	}
}

func TestCanTransitionUnknownStatus(t *testing.T) {
	t.Parallel()

	unknown := []Status{"", "new", "DELETED"}
	for _, u := range unknown {
		for _, s := range Statuses {
			if CanTransition(u, s) {
				t.Errorf("CanTransition(%q, %s) = true, want false", u, s)
			}
			if CanTransition(s, u) {
				t.Errorf("CanTransition(%s, %q) = true, want false", s, u)
			}
		}
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()

	tests := []struct {
		in      string
		want    Status
		wantErr bool
	}{
		{in: "NEW", want: StatusNew},
		{in: "PROCESSING", want: StatusProcessing},
		{in: "PUBLISHED", want: StatusPublished},
		{in: "FAILED", want: StatusFailed},
		{in: "", wantErr: true},
		{in: "new", wantErr: true},
		{in: " NEW", wantErr: true},
		{in: "NEW ", wantErr: true},
		{in: "DONE", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseStatus(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseStatus(%q) = %q, nil; want an error", tt.in, got)
				}
				if got != "" {
					t.Errorf("ParseStatus(%q) status = %q on error, want empty", tt.in, got)
				}
				// The message must name the bad input so an operator can find it.
				if quoted := `"` + tt.in + `"`; !strings.Contains(err.Error(), quoted) {
					t.Errorf("ParseStatus(%q) error %q does not name the input", tt.in, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseStatus(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("ParseStatus(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseStatusRoundTrip(t *testing.T) {
	t.Parallel()

	for _, s := range Statuses {
		got, err := ParseStatus(string(s))
		if err != nil || got != s {
			t.Errorf("ParseStatus(%q) = %q, %v; want %q, nil", s, got, err, s)
		}
	}
}
