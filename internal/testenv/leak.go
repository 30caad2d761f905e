package testenv

import "go.uber.org/goleak"

// LeakOptions returns the options every package's TestMain gives
// goleak.VerifyTestMain: the goroutines of the servers this package starts
// once per test binary and leaves running until the process exits, named
// one function each. Everything else a test binary still runs after its
// last test is a leak: a service a Stop did not end, a client a test did
// not disconnect.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		// The embedded FerretDB (see MongoURI) serves the whole binary:
		// the goroutine Run blocks in for as long as the process lives,
		goleak.IgnoreAnyFunction("github.com/outboxrelay/outbox/internal/ferret.Start.func1"),
		// its listener's accept loop,
		goleak.IgnoreAnyFunction("github.com/FerretDB/FerretDB/internal/clientconn.acceptLoop"),
		// and the health check of its PostgreSQL connection pool and the
		// background reader of each pooled connection, which stays parked
		// on a read once an idle connection is left in the pool (only
		// FerretDB opens a pgx pool in the tests). A connection the pool
		// drops, as when a test's context ends a query, also starts a
		// health check half a second later, which can outlive the tests.
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).triggerHealthCheck.func1"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"),
	}
}
