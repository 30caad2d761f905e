package broker_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/broker"
)

func TestSplitURLs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		want     []string
	}{
		{"one", "amqp://guest:guest@a:5672/", []string{"amqp://guest:guest@a:5672/"}},
		{"two", "amqp://u:p@a:5672/,amqps://u:p@b:5671/", []string{"amqp://u:p@a:5672/", "amqps://u:p@b:5671/"}},
		{"spaces", " amqp://a/ , amqp://b/ ", []string{"amqp://a/", "amqp://b/"}},
		{"comma in password", "amqp://u:p,a,ss@a/,amqp://u:p,b@b/", []string{"amqp://u:p,a,ss@a/", "amqp://u:p,b@b/"}},
		{"comma in user", "amqp://u,1:p@a/", []string{"amqp://u,1:p@a/"}},
		{"comma in query", "amqp://a/?x=1,2,amqp://b/", []string{"amqp://a/?x=1,2", "amqp://b/"}},
		{"scheme case", "amqp://a/,AMQPS://b/", []string{"amqp://a/", "AMQPS://b/"}},
		{"trailing comma", "amqp://a/,", []string{"amqp://a/,"}},
		{"empty", "", nil},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, broker.SplitURLs(tt.in)); diff != "" {
			t.Errorf("%s: SplitURLs(%q) (-want +got):\n%s", tt.name, tt.in, diff)
		}
	}
}

func TestRedactListHidesEveryPassword(t *testing.T) {
	t.Parallel()
	got := broker.RedactList("amqp://u:se,cret@a:5672/,amqp://u:other@b:5672/")
	want := "amqp://u:xxxxx@a:5672/,amqp://u:xxxxx@b:5672/"
	if got != want {
		t.Errorf("RedactList = %q, want %q", got, want)
	}
}

func TestConfigValidateChecksEveryURL(t *testing.T) {
	t.Parallel()
	for url, ok := range map[string]bool{
		"amqp://u:p,w@a:5672/,amqps://b:5671/": true,
		"amqp://a/,http://b/":                  true, // one URL: http:// does not begin a new one
		"amqp://a/,amqp://":                    false,
		"http://a/":                            false,
	} {
		_, err := broker.New(broker.Config{URL: url})
		if (err == nil) != ok {
			t.Errorf("New(URL %q): error %v, want ok=%v", url, err, ok)
		}
	}
}
