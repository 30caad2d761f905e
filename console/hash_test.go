package console_test

import (
	"net/http"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/outboxrelay/outbox/console"
)

// TestUsersTokensAreBcryptHashes: a user's token may be stored as a
// bcrypt hash (salted and slow), which signs in that user and no wrong
// token; the same token stored twice gives two hashes.
func TestUsersTokensAreBcryptHashes(t *testing.T) {
	t.Parallel()
	const anaToken = "ana-token-0123456789"
	hash := func() string {
		h, err := bcrypt.GenerateFromPassword([]byte(anaToken), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	first, second := hash(), hash()
	if first == second {
		t.Fatal("bcrypt gave one hash twice: no salt")
	}
	srv, _ := serveConfig(t, console.Config{Users: map[string]string{"ana": first}}, false)
	for i := range 2 { // the second from the console's memory of the first
		if code, _, _ := request(t, srv, http.MethodGet, "/api/events", "ana", anaToken, nil, nil); code != http.StatusOK {
			t.Errorf("ana with her token, time %d = %d, want 200", i+1, code)
		}
	}
	if code, _, _ := request(t, srv, http.MethodGet, "/api/events", "ana", anaToken+"x", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("ana with a wrong token = %d, want 401", code)
	}
}
