package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
)

// What PostgreSQL read for a run on FerretDB: the database cost of a
// claim, counted by the server under FerretDB rather than by the worker,
// so that it covers every command the run sent, and set against the
// events the run claimed. A claim that costs what it claims reads about
// as many rows per event at every backlog; one that reads the whole head
// reads more per event the larger the backlog.
//
// FerretDB v1.24's PostgreSQL backend keeps each database in a schema of
// its name and each collection in a table of one jsonb column, named
// after the collection with a hash suffix; the schema's
// _ferretdb_database_metadata table maps collection to table. The
// counters are the table's in pg_stat_user_tables: rows read by
// sequential scans (seq_tup_read) and fetched through indexes
// (idx_tup_fetch). FerretDB pushes down only equality filters, as
// `_jsonb->'status' @> '"NEW"'`, which its expression indexes cannot
// serve: nearly every command is a sequential scan of the whole table.

// TableReads is what PostgreSQL read from a run's outbox table.
type TableReads struct {
	Stage string `json:"stage"`
	Run   string `json:"run"`
	// Backlog is the documents in the collection when the run started.
	Backlog int `json:"backlog"`
	// Events are the events the run claimed (delivered, for a worker);
	// Claims the claims that read the outbox (a raw loop's batches; a
	// worker's claim runs that claimed or found nothing).
	Events   int   `json:"events"`
	Claims   int   `json:"claims"`
	SeqScans int64 `json:"seqScans"`
	IdxScans int64 `json:"idxScans"`
	// RowsRead is seq_tup_read + idx_tup_fetch.
	RowsRead int64 `json:"rowsRead"`
	// BlocksRead and BlocksHit are the table's heap blocks read from
	// disk and found in shared buffers (pg_statio_user_tables).
	BlocksRead     int64   `json:"heapBlocksRead"`
	BlocksHit      int64   `json:"heapBlocksHit"`
	RowsPerEvent   float64 `json:"rowsReadPerEvent"`
	RowsPerClaim   float64 `json:"rowsReadPerClaim"`
	BlocksPerEvent float64 `json:"heapBlocksPerEvent"`
	// SeqScansPerClaim are whole-table scans; IdxScansPerClaim index
	// lookups (FerretDB writes each updated document by _id).
	SeqScansPerClaim float64 `json:"seqScansPerClaim"`
	IdxScansPerClaim float64 `json:"idxScansPerClaim"`
}

// tableReadsFig is every reading of the run, in the order taken.
var tableReadsFig = figure[[]TableReads]{"tableReads"}

// tableReadsStage reports the readings of every stage that took them.
var tableReadsStage = stage{figures: []anyFigure{tableReadsFig}, rows: tableReadsRows}

func tableReadsRows(r *Results, add addRow) {
	for _, t := range tableReadsFig.value(r) {
		add(fmt.Sprintf("PostgreSQL rows read under FerretDB, %s: %s (%s documents at the start)", t.Stage, t.Run, thousands(t.Backlog)),
			fmt.Sprintf("%s rows per event claimed, %s per claim (%.1f table scans and %.0f index scans per claim); %s rows in all for %s events in %s claims; %.1f heap blocks per event",
				thousands(int(t.RowsPerEvent)), thousands(int(t.RowsPerClaim)), t.SeqScansPerClaim, t.IdxScansPerClaim, thousands(int(t.RowsRead)),
				thousands(t.Events), thousands(t.Claims), t.BlocksPerEvent), "")
	}
}

// statsFlushWait is how long after a run its counters are read: a busy
// PostgreSQL backend reports its counters at most once a second, an idle
// one within 10 s (PostgreSQL 15's PGSTAT_IDLE_INTERVAL).
const statsFlushWait = 11 * time.Second

// tableRun is a run whose table reads are taken when its stage ends.
type tableRun struct {
	coll    *driver.Collection
	reading TableReads
	before  pgTableStats
	counted bool // before was read
	ended   time.Time
}

// tableReadings are a stage's runs whose counters are read once the
// last has settled: one wait for the stage, not one per run. The runs'
// collections are dropped then, not before, since a dropped table's
// counters are gone.
type tableReadings struct {
	b    *bench
	runs []*tableRun
}

// start records coll's counters before a run, and takes coll over: drop
// drops it. Its reading is left out where the database is not FerretDB
// or the counters cannot be read (said so). Call end when the run is
// over.
func (t *tableReadings) start(ctx context.Context, coll *driver.Collection, stage, run string, backlog int) *tableRun {
	tr := &tableRun{coll: coll, reading: TableReads{Stage: stage, Run: run, Backlog: backlog}}
	t.runs = append(t.runs, tr)
	if !t.b.ferret {
		return tr
	}
	before, err := t.b.pgStats(ctx, coll.Name())
	if err != nil {
		fmt.Fprintf(t.b.out, "   table reads of %s not counted: %v\n", coll.Name(), err)
		return tr
	}
	tr.before, tr.counted = before, true
	return tr
}

// end notes that the run is over, having claimed events in claims.
func (tr *tableRun) end(events, claims int) {
	tr.reading.Events, tr.reading.Claims, tr.ended = events, claims, time.Now()
}

// drop drops the runs' collections.
func (t *tableReadings) drop() {
	for _, tr := range t.runs {
		dropQuietly(tr.coll)
	}
}

// finish waits for the counters to settle and records the reading of
// every run that ended in the results.
func (t *tableReadings) finish(ctx context.Context) error {
	var last time.Time
	for _, tr := range t.runs {
		if tr.counted && tr.ended.After(last) {
			last = tr.ended
		}
	}
	if !last.IsZero() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(last.Add(statsFlushWait))):
		}
	}
	for _, tr := range t.runs {
		if !tr.counted || tr.ended.IsZero() {
			continue
		}
		after, err := t.b.pgStats(ctx, tr.coll.Name())
		if err != nil {
			return err
		}
		r := tr.reading
		d := after.minus(tr.before)
		r.SeqScans, r.IdxScans, r.RowsRead, r.BlocksRead, r.BlocksHit = d.seqScan, d.idxScan, d.seqTupRead+d.idxTupFetch, d.blksRead, d.blksHit
		if r.Events > 0 {
			r.RowsPerEvent = round(float64(r.RowsRead)/float64(r.Events), 1)
			r.BlocksPerEvent = round(float64(r.BlocksRead+r.BlocksHit)/float64(r.Events), 2)
		}
		if r.Claims > 0 {
			r.RowsPerClaim = round(float64(r.RowsRead)/float64(r.Claims), 0)
			r.SeqScansPerClaim = round(float64(r.SeqScans)/float64(r.Claims), 1)
			r.IdxScansPerClaim = round(float64(r.IdxScans)/float64(r.Claims), 1)
		}
		tableReadsFig.set(t.b.res, append(tableReadsFig.value(t.b.res), r))
		fmt.Fprintf(t.b.out, "   PostgreSQL read %s rows for %s (%s per event claimed, %s per claim)\n",
			thousands(int(r.RowsRead)), r.Run, thousands(int(r.RowsPerEvent)), thousands(int(r.RowsPerClaim)))
	}
	return nil
}

// pgTableStats are a table's counters.
type pgTableStats struct {
	seqScan, seqTupRead, idxScan, idxTupFetch, blksRead, blksHit int64
}

func (a pgTableStats) minus(b pgTableStats) pgTableStats {
	return pgTableStats{a.seqScan - b.seqScan, a.seqTupRead - b.seqTupRead, a.idxScan - b.idxScan,
		a.idxTupFetch - b.idxTupFetch, a.blksRead - b.blksRead, a.blksHit - b.blksHit}
}

// pgStats reads the counters of the table behind collection, in the
// PostgreSQL database of the harness's FerretDB.
func (b *bench) pgStats(ctx context.Context, collection string) (pgTableStats, error) {
	conn, err := pgx.Connect(ctx, b.cfg.PostgresURL)
	if err != nil {
		return pgTableStats{}, fmt.Errorf("connect to PostgreSQL for table counters: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var table string
	q := fmt.Sprintf(`SELECT _jsonb->>'table' FROM %s WHERE _jsonb->>'_id' = $1`,
		pgx.Identifier{databaseName, "_ferretdb_database_metadata"}.Sanitize())
	if err := conn.QueryRow(ctx, q, collection).Scan(&table); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return pgTableStats{}, fmt.Errorf("FerretDB has no table for collection %s", collection)
		}
		return pgTableStats{}, fmt.Errorf("find the table of collection %s: %w", collection, err)
	}
	var s pgTableStats
	err = conn.QueryRow(ctx, `
		SELECT coalesce(t.seq_scan, 0), coalesce(t.seq_tup_read, 0), coalesce(t.idx_scan, 0), coalesce(t.idx_tup_fetch, 0),
		       coalesce(io.heap_blks_read, 0), coalesce(io.heap_blks_hit, 0)
		FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
		WHERE t.schemaname = $1 AND t.relname = $2`, databaseName, table).
		Scan(&s.seqScan, &s.seqTupRead, &s.idxScan, &s.idxTupFetch, &s.blksRead, &s.blksHit)
	if err != nil {
		return pgTableStats{}, fmt.Errorf("read the counters of table %s.%s: %w", databaseName, strings.ToLower(table), err)
	}
	return s, nil
}
