package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// showCommand is `worker show --id ID`.
func showCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, stderr io.Writer) error {
	var id string
	ctx, _, store, closeFn, err := startOperator(ctx, "show", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&id, "id", "", "`ID` of the event")
	}, func() error {
		if id == "" {
			return fmt.Errorf("%w: show needs --id", ErrUsage)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeFn()
	doc, err := store.Find(ctx, id)
	if err != nil {
		return err
	}
	out, err := bson.MarshalExtJSONIndent(doc, false, false, "", "  ")
	if err != nil {
		return fmt.Errorf("print event %q: %w", id, err)
	}
	_, err = fmt.Fprintf(stdout, "%s\n", out)
	return err
}
