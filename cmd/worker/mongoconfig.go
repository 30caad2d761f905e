package main

// The settings' parsers of the MongoDB connection: the URI, the read and
// write concerns.

import (
	"errors"
	"net/url"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

func parseMongoURI(dst *string, v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "mongodb" && u.Scheme != "mongodb+srv") || u.Host == "" {
		return errors.New("want mongodb://host:port or mongodb+srv://host")
	}
	*dst = v
	return nil
}

// parseWriteConcern accepts "majority" or a number of members from 1 to
// 50. w: 0 is refused: an unacknowledged write would hide whether a claim
// or a fenced mark took.
func parseWriteConcern(dst *string, v string) error {
	if v == "majority" {
		*dst = v
		return nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= 50 {
		*dst = strconv.Itoa(n)
		return nil
	}
	return errors.New("want majority or a number of members from 1 to 50 (0, unacknowledged, is not allowed)")
}

// mongoReadConcern is the read concern of OUTBOX_MONGO_READ_CONCERN.
func (c Config) mongoReadConcern() *readconcern.ReadConcern {
	return &readconcern.ReadConcern{Level: c.MongoReadConcern}
}

// mongoWriteConcern is the write concern of OUTBOX_MONGO_WRITE_CONCERN and
// OUTBOX_MONGO_JOURNAL.
func (c Config) mongoWriteConcern() *writeconcern.WriteConcern {
	wc := &writeconcern.WriteConcern{W: c.MongoWriteConcern, Journal: &c.MongoJournal}
	if n, err := strconv.Atoi(c.MongoWriteConcern); err == nil {
		wc.W = n
	}
	return wc
}
