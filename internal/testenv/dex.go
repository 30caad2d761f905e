package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"golang.org/x/crypto/bcrypt"
)

// DexImage is the Dex the container suite runs: the first release whose
// static users carry groups.
const DexImage = "ghcr.io/dexidp/dex:v2.45.1"

// EnvDexBinary names a dex binary to run instead of DexImage, which needs
// no Docker.
const EnvDexBinary = "OUTBOX_TEST_DEX_BINARY"

// DexClient is the client Dex knows the console as, and DexPassword
// every DexUser's password.
const (
	DexClientID     = "outbox-console"
	DexClientSecret = "dex-console-secret-0123456789"
	DexPassword     = "correct horse battery"
)

// DexUser is one of Dex's static users: its e-mail, user name and groups.
type DexUser struct {
	Email, Name string
	Groups      []string
}

// dexConfig is Dex's configuration: an in-memory storage, its password
// database with the static users, the console as a static client, and
// no approval screen (the console asks for nothing a user must grant).
func dexConfig(t testing.TB, issuer, listen, redirect string, users []DexUser) string {
	t.Helper()
	// Dex refuses a cost under 10, with a 500 at its form.
	hash, err := bcrypt.GenerateFromPassword([]byte(DexPassword), bcrypt.DefaultCost)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "issuer: %s\nstorage:\n  type: memory\nweb:\n  http: %s\n", issuer, listen)
	b.WriteString("logger:\n  level: warn\noauth2:\n  skipApprovalScreen: true\n  responseTypes: [code]\nenablePasswordDB: true\n")
	fmt.Fprintf(&b, "staticClients:\n  - id: %s\n    secret: %s\n    name: outbox console\n    redirectURIs:\n      - %s\n", DexClientID, DexClientSecret, redirect)
	b.WriteString("staticPasswords:\n")
	for i, u := range users {
		fmt.Fprintf(&b, "  - email: %q\n    hash: %q\n    username: %q\n    userID: \"%08d-0000-4000-8000-000000000000\"\n    groups: [%s]\n",
			u.Email, hash, u.Name, i+1, strings.Join(u.Groups, ", "))
	}
	return b.String()
}

// Dex starts Dex with users and a client whose redirect URL is
// redirect, and returns its issuer once its discovery document is
// served. It runs the binary EnvDexBinary names, or else DexImage, which
// needs Docker (RequireDocker: the test skips, or fails under
// EnvRequireDocker=required, without it).
func Dex(t testing.TB, redirect string, users []DexUser) string {
	t.Helper()
	port, err := freePort(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Dex writes its issuer into its tokens: the address the console and
	// the browser reach it at, known before it starts.
	issuer := fmt.Sprintf("http://127.0.0.1:%d/dex", port)
	config := filepath.Join(t.TempDir(), "config.yaml")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if bin := os.Getenv(EnvDexBinary); bin != "" {
		if err := os.WriteFile(config, []byte(dexConfig(t, issuer, fmt.Sprintf("127.0.0.1:%d", port), redirect, users)), 0o600); err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		cmd := exec.CommandContext(context.WithoutCancel(t.Context()), bin, "serve", config)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("dex's log:\n%s", logs.String())
			}
		})
	} else {
		RequireDocker(t)
		// Readable by the image's own user.
		if err := os.WriteFile(config, []byte(dexConfig(t, issuer, fmt.Sprintf("0.0.0.0:%d", port), redirect, users)), 0o644); err != nil {
			t.Fatal(err)
		}
		// The same port inside and out, so that the issuer is right on
		// both sides.
		c, err := testcontainers.Run(ctx, DexImage,
			testcontainers.WithExposedPorts(fmt.Sprintf("127.0.0.1:%d:%d/tcp", port, port)),
			testcontainers.WithFiles(testcontainers.ContainerFile{HostFilePath: config, ContainerFilePath: "/etc/dex/outbox.yaml", FileMode: 0o644}),
			testcontainers.WithCmd("dex", "serve", "/etc/dex/outbox.yaml"),
		)
		testcontainers.CleanupContainer(t, c)
		if err != nil {
			t.Fatalf("start %s: %v", DexImage, err)
		}
	}
	discovery := issuer + "/.well-known/openid-configuration"
	Eventually(t, time.Minute, func() (bool, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, discovery, nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%s answered %d", discovery, resp.StatusCode)
	})
	return issuer
}

// freePort is a port nothing listens on now.
func freePort(ctx context.Context) (int, error) {
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := lis.Addr().(*net.TCPAddr).Port
	return port, lis.Close()
}
