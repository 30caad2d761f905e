package envflag

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

type settings struct {
	url   string
	count int
	rate  float64
	every time.Duration
}

// newSet defines one flag of each kind; the usage text goes to out.
func newSet(out *bytes.Buffer) (*Set, *settings) {
	var c settings
	s := NewSet("test")
	s.fs.SetOutput(out)
	s.String(&c.url, "url", "TEST_URL", "amqp://localhost/", "broker URL")
	s.Int(&c.count, "count", "TEST_COUNT", 1, "how many")
	s.Float64(&c.rate, "rate", "TEST_RATE", 2.5, "per second")
	s.Duration(&c.every, "every", "TEST_EVERY", time.Second, "how often")
	return s, &c
}

func TestParseFlagThenEnvThenDefault(t *testing.T) {
	t.Parallel()
	s, c := newSet(new(bytes.Buffer))
	env := map[string]string{"TEST_URL": "amqp://env/", "TEST_COUNT": " 7 ", "TEST_RATE": "4", "TEST_EVERY": "3s"}
	if err := s.Parse([]string{"--url", "amqp://flag/"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if want := (settings{"amqp://flag/", 7, 4, 3 * time.Second}); *c != want {
		t.Errorf("settings %+v, want %+v: the flag's URL, the rest from the environment", *c, want)
	}
	s, c = newSet(new(bytes.Buffer))
	if err := s.Parse(nil, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	if want := (settings{"amqp://localhost/", 1, 2.5, time.Second}); *c != want {
		t.Errorf("settings %+v, want the defaults %+v", *c, want)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	s, _ := newSet(new(bytes.Buffer))
	err := s.Parse(nil, func(k string) string {
		return map[string]string{"TEST_COUNT": "amqp://u:s3cret@h/"}[k]
	})
	if err == nil || !strings.Contains(err.Error(), "TEST_COUNT") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v: want one naming TEST_COUNT without the password", err)
	}
	s, _ = newSet(new(bytes.Buffer))
	if err := s.Parse([]string{"extra"}, func(string) string { return "" }); err == nil {
		t.Error("a positional argument was accepted")
	}
}

// TestHelpNamesTheVariables: -h is flag.ErrHelp, and each flag's usage
// says which variable it reads.
func TestHelpNamesTheVariables(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s, _ := newSet(&out)
	if err := s.Parse([]string{"-h"}, func(string) string { return "" }); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: error %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"broker URL (env TEST_URL)", "how many (env TEST_COUNT)", "per second (env TEST_RATE)", "how often (env TEST_EVERY)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help does not say %q:\n%s", want, out.String())
		}
	}
}
