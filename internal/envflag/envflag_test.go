package envflag

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func newFlags() (*flag.FlagSet, *string, *int) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs, fs.String("url", "amqp://localhost/", ""), fs.Int("count", 1, "")
}

var bindings = []Binding{{Flag: "url", Env: "TEST_URL"}, {Flag: "count", Env: "TEST_COUNT"}}

func TestParseFlagThenEnvThenDefault(t *testing.T) {
	t.Parallel()
	fs, url, count := newFlags()
	env := map[string]string{"TEST_URL": "amqp://env/", "TEST_COUNT": " 7 "}
	if err := Parse(fs, []string{"--url", "amqp://flag/"}, func(k string) string { return env[k] }, bindings); err != nil {
		t.Fatal(err)
	}
	if *url != "amqp://flag/" || *count != 7 {
		t.Errorf("url %q count %d, want the flag's amqp://flag/ and the environment's 7", *url, *count)
	}
	fs, url, count = newFlags()
	if err := Parse(fs, nil, func(string) string { return "" }, bindings); err != nil {
		t.Fatal(err)
	}
	if *url != "amqp://localhost/" || *count != 1 {
		t.Errorf("url %q count %d, want the defaults", *url, *count)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	fs, _, _ := newFlags()
	err := Parse(fs, nil, func(k string) string {
		return map[string]string{"TEST_COUNT": "amqp://u:s3cret@h/"}[k]
	}, bindings)
	if err == nil || !strings.Contains(err.Error(), "TEST_COUNT") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v: want one naming TEST_COUNT without the password", err)
	}
	fs, _, _ = newFlags()
	if err := Parse(fs, []string{"extra"}, func(string) string { return "" }, bindings); err == nil {
		t.Error("a positional argument was accepted")
	}
	fs, _, _ = newFlags()
	if err := Parse(fs, []string{"-h"}, func(string) string { return "" }, bindings); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: error %v, want flag.ErrHelp", err)
	}
}
