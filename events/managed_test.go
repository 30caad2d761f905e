package events_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

func TestCheckManaged(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)
	for name, tt := range map[string]struct {
		fields  bson.D
		want    events.Managed
		wantErr string // the whole message, when invalid
	}{
		"none":                  {want: events.Managed{}},
		"int attempts":          {fields: bson.D{{Key: "attempts", Value: int32(3)}}, want: events.Managed{Attempts: 3}},
		"long attempts":         {fields: bson.D{{Key: "attempts", Value: int64(4)}}, want: events.Managed{Attempts: 4}},
		"whole double attempts": {fields: bson.D{{Key: "attempts", Value: 2.0}}, want: events.Managed{Attempts: 2}},
		"huge long attempts":    {fields: bson.D{{Key: "attempts", Value: int64(math.MaxInt64)}}, want: events.Managed{Attempts: math.MaxInt32}},
		"null attempts":         {fields: bson.D{{Key: "attempts", Value: nil}}, want: events.Managed{AttemptsNull: true}},
		"every field valid": {fields: bson.D{
			{Key: "attempts", Value: 1}, {Key: "processingAt", Value: now}, {Key: "retryAt", Value: now},
			{Key: "claimToken", Value: "t"}, {Key: "workerId", Value: "w"}}, want: events.Managed{Attempts: 1}},
		"every field null": {fields: bson.D{
			{Key: "attempts", Value: nil}, {Key: "processingAt", Value: nil}, {Key: "retryAt", Value: nil},
			{Key: "claimToken", Value: nil}, {Key: "workerId", Value: nil}}, want: events.Managed{AttemptsNull: true}},
		"string attempts": {fields: bson.D{{Key: "attempts", Value: "3"}},
			wantErr: `invalid event: field "attempts" must be a whole number of 0 or more, got string; the worker manages this field`},
		"negative attempts": {fields: bson.D{{Key: "attempts", Value: -1}},
			wantErr: `invalid event: field "attempts" must be a whole number of 0 or more, got -1; the worker manages this field`},
		"fractional attempts": {fields: bson.D{{Key: "attempts", Value: 1.5}},
			wantErr: `invalid event: field "attempts" must be a whole number of 0 or more, got double 1.5; the worker manages this field`},
		"NaN attempts": {fields: bson.D{{Key: "attempts", Value: math.NaN()}},
			wantErr: `invalid event: field "attempts" must be a whole number of 0 or more, got double NaN; the worker manages this field`},
		"decimal attempts": {fields: bson.D{{Key: "attempts", Value: bson.NewDecimal128(0, 1)}},
			wantErr: `invalid event: field "attempts" must be a whole number of 0 or more, got decimal; the worker manages this field`},
		"bool attempts": {fields: bson.D{{Key: "attempts", Value: true}},
			wantErr: `invalid event: field "attempts" must be a whole number of 0 or more, got bool; the worker manages this field`},
		"string processingAt": {fields: bson.D{{Key: "processingAt", Value: "2025-03-04"}},
			wantErr: `invalid event: field "processingAt" must be a date, got string; the worker manages this field`},
		"number retryAt": {fields: bson.D{{Key: "retryAt", Value: int64(1741089600000)}},
			wantErr: `invalid event: field "retryAt" must be a date, got long; the worker manages this field`},
		"object claimToken": {fields: bson.D{{Key: "claimToken", Value: bson.D{}}},
			wantErr: `invalid event: field "claimToken" must be a string, got object; the worker manages this field`},
		"array workerId": {fields: bson.D{{Key: "workerId", Value: bson.A{"w"}}},
			wantErr: `invalid event: field "workerId" must be a string, got array; the worker manages this field`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			doc := append(bson.D{{Key: "_id", Value: "e1"}, {Key: "type", Value: "order.created"},
				{Key: "payload", Value: bson.D{}}, {Key: "status", Value: "NEW"}, {Key: "createdAt", Value: now}}, tt.fields...)
			raw, err := bson.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			got, err := events.CheckManaged(raw)
			if tt.wantErr != "" {
				var ie *events.InvalidError
				if !errors.As(err, &ie) || err.Error() != tt.wantErr {
					t.Fatalf("CheckManaged error = %v, want *InvalidError %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("CheckManaged: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("CheckManaged (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckManagedMalformed(t *testing.T) {
	t.Parallel()
	for _, raw := range []bson.Raw{nil, {0x05, 0, 0}, {0xff, 0xff, 0xff, 0x7f, 0x10, 'a', 0}} {
		_, err := events.CheckManaged(raw)
		var ie *events.InvalidError
		if !errors.As(err, &ie) || ie.Field != events.FieldDocument {
			t.Errorf("CheckManaged(%x) = %v, want an InvalidError on %s", []byte(raw), err, events.FieldDocument)
		}
	}
}

func TestCheckSize(t *testing.T) {
	t.Parallel()
	const reserve = events.ManagedReserveBytes + 8
	for _, tt := range []struct {
		size int
		ok   bool
	}{
		{1000, true},
		{events.MaxDocumentBytes - reserve, true},
		{events.MaxDocumentBytes - reserve + 1, false},
		{events.MaxDocumentBytes, false},
		{events.MaxDocumentBytes + 10, false},
	} {
		err := events.CheckSize(tt.size, reserve)
		if tt.ok != (err == nil) {
			t.Errorf("CheckSize(%d, %d) = %v, want ok %t", tt.size, reserve, err, tt.ok)
		}
		if err != nil {
			for _, want := range []string{`"_document"`, "16777216-byte", " bytes"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("CheckSize(%d) = %q, want it to name %s", tt.size, err, want)
				}
			}
		}
	}
}
