// Package ferret runs FerretDB v1 embedded in the current process, with its
// PostgreSQL backend, as a MongoDB wire-protocol server for development and
// tests on machines without MongoDB. It is never used by the worker itself.
//
// FerretDB differs from MongoDB in ways that matter to this project (no
// transactions, no change streams, no per-document atomicity of
// filter-and-update under concurrency); see docs/performance.md before
// reading results obtained with it.
package ferret

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// Start starts an embedded FerretDB listening on listenAddr (host:port; port 0
// picks a free one) and storing its data in the PostgreSQL database named by
// pgURL, which must already exist (see EnsurePostgresDatabase). It returns the
// MongoDB URI of the listener once it accepts connections.
//
// FerretDB runs until ctx is canceled, then closes its listener, its client
// connections and its PostgreSQL pool. FerretDB connects to PostgreSQL lazily:
// a wrong pgURL shows up on the first command, not here.
func Start(ctx context.Context, listenAddr, pgURL string, logger *slog.Logger) (uri string, err error) {
	if listenAddr == "" {
		return "", errors.New("ferret: listen address is empty")
	}
	if pgURL == "" {
		return "", errors.New("ferret: PostgreSQL URL is empty")
	}
	if logger == nil {
		logger = slog.Default()
	}

	f, err := ferretdb.New(&ferretdb.Config{
		Listener:      ferretdb.ListenerConfig{TCP: listenAddr},
		Logger:        logger,
		Handler:       "postgresql",
		PostgreSQLURL: pgURL,
	})
	if err != nil {
		return "", fmt.Errorf("ferret: start on %s: %w", listenAddr, err)
	}

	// In v1.24.0 ferretdb.New already binds the listener, but its
	// documentation only promises the address once Run has started, so Run
	// goes first: MongoDBURI waits for the listener to be ready.
	go func() {
		_ = f.Run(ctx) // always nil; it returns when ctx is canceled.
	}()

	return f.MongoDBURI(), nil
}
