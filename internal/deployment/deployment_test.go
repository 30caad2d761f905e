package deployment_test

import (
	"testing"

	"github.com/outboxrelay/outbox/internal/deployment"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// The test server is FerretDB: no replica set, so no transactions.
func TestFerretDB(t *testing.T) {
	t.Parallel()
	client := testenv.Database(t).Client()
	txn, err := deployment.SupportsTransactions(t.Context(), client)
	if err != nil || txn {
		t.Errorf("SupportsTransactions = %t, %v; want false, nil on FerretDB", txn, err)
	}
	ferret, err := deployment.IsFerretDB(t.Context(), client)
	if err != nil || !ferret {
		t.Errorf("IsFerretDB = %t, %v; want true, nil", ferret, err)
	}
}
