package main

import (
	"strings"
	"testing"
)

func TestParseConfigMongo(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_MONGO_URI": "mongodb://db:27017/?replicaSet=rs0", "CONSUMER_INBOX_COLLECTION": "orders_inbox"}
	c, err := parseConfig(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.MongoURI != env["OUTBOX_MONGO_URI"] || c.InboxCollection != "orders_inbox" || c.Database != "outbox" {
		t.Errorf("config = %+v, want the environment's URI and collection, database outbox", c)
	}
	_, err = parseConfig([]string{"--mongo-uri", "http://user:secret@db/"}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "OUTBOX_MONGO_URI") || strings.Contains(err.Error(), "secret") {
		t.Errorf("bad URI: error %v, want one naming OUTBOX_MONGO_URI without the password", err)
	}
}
