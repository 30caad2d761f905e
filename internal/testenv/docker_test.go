package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// skipRecorder is a real testing.TB whose Skipf only records the message.
type skipRecorder struct {
	testing.TB
	skipped, failed string
}

func (r *skipRecorder) Helper() {}

func (r *skipRecorder) Skipf(format string, args ...any) { r.skipped = fmt.Sprintf(format, args...) }

func (r *skipRecorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

// Not parallel: it swaps the package's Docker check.
func TestRequireDocker(t *testing.T) {
	orig := checkDocker
	t.Cleanup(func() { checkDocker = orig })

	checkDocker = func(context.Context) error { return errors.New("Cannot connect to the Docker daemon") }
	r := &skipRecorder{TB: t}
	RequireDocker(r)
	if !strings.Contains(r.skipped, "Docker engine not available") || !strings.Contains(r.skipped, "Cannot connect to the Docker daemon") {
		t.Errorf("without Docker: skipped with %q, want a message saying Docker is not available and why", r.skipped)
	}

	t.Setenv(EnvRequireDocker, "required")
	r = &skipRecorder{TB: t}
	RequireDocker(r)
	if r.skipped != "" || !strings.Contains(r.failed, "Docker engine not available") {
		t.Errorf("without Docker, %s=required: skipped with %q, failed with %q; want a failure, no skip", EnvRequireDocker, r.skipped, r.failed)
	}

	checkDocker = func(context.Context) error { return nil }
	r = &skipRecorder{TB: t}
	RequireDocker(r)
	if r.skipped != "" {
		t.Errorf("with Docker: skipped with %q, want no skip", r.skipped)
	}
}

func TestDirectURI(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"mongodb://127.0.0.1:32768", "mongodb://127.0.0.1:32768?directConnection=true"},
		{"mongodb://127.0.0.1:32768/?replicaSet=rs0", "mongodb://127.0.0.1:32768/?directConnection=true&replicaSet=rs0"},
		{"mongodb://127.0.0.1:32768/?directConnection=false", "mongodb://127.0.0.1:32768/?directConnection=true"},
	} {
		got, err := directURI(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("directURI(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := directURI("mongodb://%zz"); err == nil {
		t.Error("directURI of an unparsable URI: no error")
	}
}
