// Package mongo is the outbox's MongoDB store: it claims NEW events for a
// worker, marks them PUBLISHED or releases them, resets stale claims,
// deletes old PUBLISHED events, and answers the operators' questions
// (counts, oldest NEW event, requeue).
//
// Every write after a claim is fenced: its filter names the status, the
// worker id and the claim token, so a worker that lost its claim changes
// nothing. Every filter starts with a status equality, which is what the
// indexes are built on (and all that FerretDB pushes down to PostgreSQL).
//
// Where the deployment supports transactions (a replica set or a sharded
// cluster) the PUBLISHED write runs inside one; on a standalone server the
// fenced single write is used and is correct on its own.
package mongo
