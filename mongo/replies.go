package mongo

import (
	"context"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A claim's finds size their replies by the documents the claims have
// met, so that a backlog of large documents never builds a reply no
// client can read.

// replyBudget bounds the bytes of documents one reply of a claim's find
// carries. MongoDB caps a reply batch at 16 MiB itself; FerretDB does not,
// and a reply over the driver's message limit (48 MB) fails the find
// whatever the byte bound of the batch, every time: a backlog of large
// documents would stall.
const replyBudget = 16 << 20

// findBatch is the batch size of a claim's finds: one reply for a whole
// batch of ordinary documents, fewer documents per reply once the claims
// have met large ones.
func (s *Store) findBatch(limit int) int32 { return s.capBatch(oneBatch(limit)) }

// capBatch lowers a batch size n so that a reply of the largest documents
// the claims have met stays within replyBudget.
func (s *Store) capBatch(n int32) int32 {
	if largest := s.largestDoc.Load(); largest > 0 {
		n = min(n, int32(max(1, replyBudget/largest)))
	}
	return n
}

// noteReplySizes keeps what findBatch needs: the largest document a
// successful claim read. After a find failed, for any reason but a
// shutdown, the next claim reads one document per reply, since a reply
// too large to read fails the same way every time; the claim after a
// success goes back to whole batches. That includes a find cut off by its
// deadline: FerretDB takes minutes to build a reply of a few hundred
// megabytes (measured in docs/performance.md, Large replies on FerretDB),
// so the first claim of large documents times out rather than failing on
// the reply's size. One document per reply costs round trips, not server
// work.
func (s *Store) noteReplySizes(ctx context.Context, docs []bson.Raw, err error) {
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) {
			s.largestDoc.Store(replyBudget)
		}
		return
	}
	var largest int64
	for _, d := range docs {
		largest = max(largest, int64(len(d)))
	}
	s.largestDoc.Store(largest)
}

// oneBatch is the batch size that returns up to limit documents in the
// find's reply alone: one more than the limit, because a server whose
// first batch comes back exactly full may keep the cursor open (FerretDB
// does), and the driver then spends a getMore round trip to learn that
// nothing follows.
func oneBatch(limit int) int32 {
	return int32(min(limit+1, 1<<20))
}
