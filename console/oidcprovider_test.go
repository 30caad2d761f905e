package console_test

import (
	"context"
	"crypto/sha256"
	"html/template"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// A real OpenID provider in the test process: zitadel/oidc's op package
// (a certified implementation) over the in-memory storage of its
// example, with a sign-in form of our own and a roles claim in the
// userinfo. Its users are those of opUsers, each with the password
// opPassword.

const (
	opClientID     = "outbox-console"
	opClientSecret = "console-secret-0123456789"
	opPassword     = "correct horse battery"
	// opRolesClaim is where the provider puts the console roles.
	opRolesClaim = "outbox_roles"
)

// opUsers are the provider's users and their console roles.
var opUsers = map[string][]string{
	"vera@example.com": {"viewer"},
	"otto@example.com": {"operator", "unrelated-role"},
	"ada@example.com":  {"viewer", "admin"},
	"nora@example.com": {},
}

// userStore is the provider's users.
type userStore map[string]*storage.User

func (u userStore) GetUserByID(id string) *storage.User { return u[id] }
func (u userStore) GetUserByUsername(name string) *storage.User {
	for _, user := range u {
		if user.Username == name {
			return user
		}
	}
	return nil
}
func (u userStore) ExampleClientID() string { return "service" }

// rolesStorage adds each user's console roles to the userinfo.
type rolesStorage struct {
	*storage.Storage
	users userStore
}

func (s rolesStorage) roles(subject string) []string {
	if u := s.users[subject]; u != nil {
		return opUsers[u.Email]
	}
	return nil
}

func (s rolesStorage) SetUserinfoFromToken(ctx context.Context, info *oidc.UserInfo, tokenID, subject, origin string) error {
	if err := s.Storage.SetUserinfoFromToken(ctx, info, tokenID, subject, origin); err != nil {
		return err
	}
	info.AppendClaims(opRolesClaim, s.roles(subject))
	return nil
}

// signInForm is the provider's sign-in page.
var signInForm = template.Must(template.New("signin").Parse(`<!doctype html>
<html><head><title>Provider sign-in</title></head><body>
<form method="post" action="/login/username">
<input type="hidden" name="id" value="{{.}}">
<label>User <input id="username" name="username"></label>
<label>Password <input id="password" name="password" type="password"></label>
<button id="provider-submit" type="submit">Sign in</button>
</form></body></html>`))

// startProvider serves an OpenID provider that lets the console at
// redirect (its callback URL) sign users in; it returns its issuer.
func startProvider(t *testing.T, redirect string) string {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + lis.Addr().String()
	users := userStore{}
	for email := range opUsers {
		id := email
		users[id] = &storage.User{ID: id, Username: email, Password: opPassword, Email: email, EmailVerified: true, PreferredLanguage: language.English}
	}
	store := rolesStorage{
		Storage: storage.NewStorageWithClients(users, map[string]*storage.Client{
			opClientID: storage.WebClient(opClientID, opClientSecret, redirect),
		}),
		users: users,
	}
	provider, err := op.NewProvider(&op.Config{
		CryptoKey: sha256.Sum256([]byte(t.Name())), CodeMethodS256: true, AuthMethodPost: true,
		SupportedUILocales: []language.Tag{language.English},
	}, store, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login/username", func(w http.ResponseWriter, r *http.Request) {
		_ = signInForm.Execute(w, r.URL.Query().Get("authRequestID"))
	})
	issuerOf := op.NewIssuerInterceptor(provider.IssuerFromRequest)
	callback := op.AuthCallbackURL(provider)
	mux.Handle("POST /login/username", issuerOf.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PostFormValue("id")
		if err := store.CheckUsernamePassword(r.PostFormValue("username"), r.PostFormValue("password"), id); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			_ = signInForm.Execute(w, id)
			return
		}
		http.Redirect(w, r, callback(r.Context(), id), http.StatusFound)
	}))
	mux.Handle("/", provider)
	srv := httptest.NewUnstartedServer(mux)
	_ = srv.Listener.Close()
	srv.Listener = lis
	srv.Start()
	t.Cleanup(srv.Close)
	return issuer
}
