// Package deployment asks a MongoDB server what kind of deployment it is,
// for the outbox store and the consumer's inbox, which both choose how
// they write from the answer.
package deployment

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// SupportsTransactions asks the server what it is: transactions need a
// replica set member (setName) or a mongos router (msg "isdbgrid"). A
// standalone server, and FerretDB, report neither.
func SupportsTransactions(ctx context.Context, client *mongo.Client) (bool, error) {
	var hello struct {
		SetName string `bson:"setName"`
		Msg     string `bson:"msg"`
	}
	err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello)
	if err != nil {
		return false, fmt.Errorf("ask the server what it is (hello): %w", err)
	}
	return hello.SetName != "" || hello.Msg == "isdbgrid", nil
}

// IsFerretDB reports a FerretDB server, which names its own version in
// buildInfo.
func IsFerretDB(ctx context.Context, client *mongo.Client) (bool, error) {
	var info bson.Raw
	err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info)
	if err != nil {
		return false, fmt.Errorf("ask the server its build (buildInfo): %w", err)
	}
	_, err = info.LookupErr("ferretdbVersion")
	return err == nil, nil
}
