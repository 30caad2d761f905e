package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()

	defaults := config{
		MongoURI:   "mongodb://localhost:27017",
		Database:   "outbox",
		Collection: "events",
		Rate:       20,
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want config
	}{
		{name: "defaults", want: defaults},
		{
			name: "environment",
			env: map[string]string{
				"OUTBOX_MONGO_URI":        "mongodb://db:27017/?replicaSet=rs0",
				"OUTBOX_MONGO_DATABASE":   "shop",
				"OUTBOX_MONGO_COLLECTION": "outbox",
				"PRODUCER_RATE":           "2.5",
				"PRODUCER_COUNT":          "100",
			},
			want: config{MongoURI: "mongodb://db:27017/?replicaSet=rs0", Database: "shop", Collection: "outbox", Rate: 2.5, Count: 100},
		},
		{
			name: "flags win over the environment",
			args: []string{"--rate", "5", "--count", "0", "--database", "flagdb"},
			env:  map[string]string{"PRODUCER_RATE": "50", "PRODUCER_COUNT": "7", "OUTBOX_MONGO_DATABASE": "envdb"},
			want: config{MongoURI: defaults.MongoURI, Database: "flagdb", Collection: "events", Rate: 5},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseConfig(tt.args, func(k string) string { return tt.env[k] })
			if err != nil {
				t.Fatalf("parseConfig: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parseConfig (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConfigInvalid(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantMsg string
	}{
		{name: "rate zero", args: []string{"--rate", "0"}, wantMsg: "PRODUCER_RATE"},
		{name: "rate NaN", args: []string{"--rate", "NaN"}, wantMsg: "PRODUCER_RATE"},
		{name: "rate not a number", env: map[string]string{"PRODUCER_RATE": "fast"}, wantMsg: "PRODUCER_RATE"},
		{name: "negative count", env: map[string]string{"PRODUCER_COUNT": "-1"}, wantMsg: "PRODUCER_COUNT"},
		{name: "empty database", args: []string{"--database", ""}, wantMsg: "OUTBOX_MONGO_DATABASE"},
		{name: "stray argument", args: []string{"extra"}, wantMsg: "extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseConfig(tt.args, func(k string) string { return tt.env[k] })
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("parseConfig error = %v, want one naming %s", err, tt.wantMsg)
			}
		})
	}
}
