package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"amqp://guest:secret@rabbit:5672/", "amqp://guest:xxxxx@rabbit:5672/"},
		{"mongodb://app:pa%40ss@db1:27017,db2:27017/?replicaSet=rs0", "mongodb://app:xxxxx@db1:27017,db2:27017/?replicaSet=rs0"},
		{"mongodb://db:27017", "mongodb://db:27017"},
		{"guest:secret@rabbit:5672", "<redacted>@rabbit:5672"},
		{"amqp:guest:secret@rabbit", "<redacted>@rabbit"},
		{"amqp://user:pa ss@host", "amqp://<redacted>@host"},
		{"mongodb://app:p@ss/w0rd@db/", "mongodb://<redacted>@db/"},
		{"%zz", "<redacted>"},
	} {
		got := URL(tt.in)
		if got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.Contains(got, "secret") || strings.Contains(got, "pa ss") || strings.Contains(got, "w0rd") {
			t.Errorf("URL(%q) = %q shows the password", tt.in, got)
		}
	}
}

func TestValue(t *testing.T) {
	t.Parallel()
	if got := Value("30s"); got != "30s" {
		t.Errorf("Value(30s) = %q", got)
	}
	if got := Value("amqp://u:p@h/"); got != "amqp://u:xxxxx@h/" {
		t.Errorf("Value(url) = %q", got)
	}
}
