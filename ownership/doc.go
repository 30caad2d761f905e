// Package ownership divides the outbox's partitions (events.Partitions)
// between the worker's replicas, so that each partition has at most one
// claimer at a time and the claim's guarded update never races.
//
// Ownership is a sequence of terms per partition. A term is a document
// whose _id is "<partition>/<term>" in the owners collection; inserting it
// is the only way to take or renew a partition, and a unique _id lets
// exactly one insert win, on MongoDB and on FerretDB alike (a guarded
// update is not atomic on FerretDB). A term ends at its expiresAt, by the
// database server's clock; its owner renews it by inserting the next term
// before then, and anyone may insert the next term once it has expired.
//
// Fencing: an owner claims in a partition only until its own deadline,
// measured on its local monotonic clock, TermLength less Margin from the
// local instant it read together with the server time the term's
// expiresAt was computed from (at the start of the round, or in Renew just
// before its insert), so never from later: whatever the round did before
// the insert (a heartbeat, waiting for the write lock behind a claim, a
// release) shortens the owner's validity rather than extending it. A
// replica that did not hear from the database (a pause, a partition, a
// lost renewal) stops claiming on its own, and Hold stops handing out a
// partition a further Margin before the deadline. Another replica takes
// the partition only Margin after the term's expiresAt, or at once if the
// owner gave it back (the owner stopped claiming before it wrote that
// term), unless a claim write of the owner in it ended without an answer
// less than a Margin before: then two Margins after the give-back, so that
// the write cannot land after the new owner's first read (Wrote). The server's time is mongo.Clock's, which runs on the monotonic
// clock between measurements, and no partition is taken before the first
// measurement (Config.Synced). A measurement that finds the server's time
// more than a Margin from what the last one predicted (ClockJumped) counts
// as losing every partition for a term. Of the three margins between the owner's
// last claim and a takeover, two cover the two replicas' clock
// uncertainty and one the end of a write the server carries on with
// after the claimer gave up on it.
//
// Balance: every replica announces itself with a heartbeat document it
// alone writes; each aims for ceil(Partitions / live replicas) partitions,
// gives back its excess by inserting a term that expires at once, and
// takes free partitions up to its share. Rounds run every roundMax while
// the shares move and rest up to quietMax (or a third of a term, when
// longer: restMax) between reads once they hold
// still. A join or a death settles within about one term.
//
// Renewal runs on a schedule of its own, checked four times a round: a
// renewal falls due a third of a term after the last, and waits only for
// its own insert and check read, never for a round's read, heartbeat or
// takes, which through a slow database could outlast the rest of a term.
// A round renews first too, when due, and a claim whose write needs more
// time than its validity renews through Renew; the three are serialized,
// and each has a deadline.
//
// Where the deployment has transactions, the database's fence may refuse
// a claim of this replica (another holds the partition under a later
// tenure, or the owners collection was dropped and the terms restarted
// below the fences): the claimer reports it (Wrote), and the partition is
// dropped and given back under a term numbered at the fence's tenure, so
// that its next owner's tenure passes the fence.
package ownership
