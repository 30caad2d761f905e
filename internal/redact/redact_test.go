package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"amqp://guest:secret@rabbit:5672/", "amqp://guest:xxxxx@rabbit:5672/"},
		{"mongodb://app:pa%40ss@db1:27017,db2:27017/?replicaSet=rs0", "mongodb://app:xxxxx@db1:27017,db2:27017/?replicaSet=xxxxx"},
		{"mongodb://db:27017", "mongodb://db:27017"},
		{"guest:secret@rabbit:5672", "<redacted>@rabbit:5672"},
		{"amqp:guest:secret@rabbit", "<redacted>@rabbit"},
		{"amqp://user:pa ss@host", "amqp://<redacted>@host"},
		{"mongodb://app:p@ss/w0rd@db/", "mongodb://<redacted>@db/"},
		{"%zz", "<redacted>"},
		// Query values may be secrets: every one is hidden, the option
		// names stay, in their order.
		{"mongodb://db/?tls=true&tlsCertificateKeyFilePassword=secret", "mongodb://db/?tls=xxxxx&tlsCertificateKeyFilePassword=xxxxx"},
		{"mongodb://db/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:secret",
			"mongodb://db/?authMechanism=xxxxx&authMechanismProperties=xxxxx"},
		{"mongodb+srv://app:secret@cluster.example.com/outbox?retryWrites=true&w=majority",
			"mongodb+srv://app:xxxxx@cluster.example.com/outbox?retryWrites=xxxxx&w=xxxxx"},
		{"amqps://u:secret@rabbit:5671/?certfile=/secret/cert.pem&keyfile=/secret/key.pem",
			"amqps://u:xxxxx@rabbit:5671/?certfile=xxxxx&keyfile=xxxxx"},
		{"mongodb://db/?secret", "mongodb://db/?xxxxx"},
		{"mongodb://db/?a=1&&secret&b=", "mongodb://db/?a=xxxxx&xxxxx&xxxxx&b=xxxxx"},
		// Not parsed: the query goes whole, also when a value holds an
		// "@" (which would otherwise look like the end of a password).
		{"mongodb://app:p@ss@db/?tlsCertificateKeyFilePassword=secret", "mongodb://<redacted>@db/?<redacted>"},
		{"mongodb://app:pw@db/?authMechanismProperties=TOKEN:se@cret", "mongodb://<redacted>@db/?<redacted>"},
		{"mongodb://u:p?secret@db/", "mongodb://<redacted>"},
		{"guest:secret@rabbit?password=secret", "<redacted>@rabbit?<redacted>"},
	} {
		got := URL(tt.in)
		if got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		for _, secret := range []string{"secret", "pa ss", "w0rd", "se@"} {
			if strings.Contains(got, secret) {
				t.Errorf("URL(%q) = %q shows %q", tt.in, got, secret)
			}
		}
	}
}

func TestValue(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"30s", "30s"},
		{"amqp://u:p@h/", "amqp://u:xxxxx@h/"},
		{"mongodb://h/?tlsCertificateKeyFilePassword=p", "mongodb://h/?tlsCertificateKeyFilePassword=xxxxx"},
	} {
		if got := Value(tt.in); got != tt.want {
			t.Errorf("Value(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
