package check

import "slices"

// publishTimeout is how long a round waits for its confirms.
const publishTimeout ms = 1000

// pubBatch is a claimed batch, with when the database answered the
// claim's reads of the paused types and of the holds (for the oracle).
type pubBatch struct {
	docs                        []*doc
	keys                        []string
	token                       int64
	pausedAt, heldAt, claimedAt ms
	behind                      map[int]bool // won behind a lost event of its key: not published
}

// What became of one event of a batch.
const (
	unsent = iota // not published: held back, or past the batch's time
	pending
	acked
	nacked
	returned
	timedOut
)

// publisher publishes one batch at a time, the next waiting (a claim
// waits while one does).
type publisher struct {
	r         *replica
	cur, next *pubBatch
}

func (p *publisher) enqueue(b *pubBatch) {
	if p.cur == nil {
		p.cur = b
		p.start(b)
		return
	}
	p.next = b
}

// start publishes b in rounds (claim/rounds.go): round i holds the i-th
// event of each key, and starts once the last round's confirms are in;
// an event not confirmed stops its key for the rest of the batch.
func (p *publisher) start(b *pubBatch) {
	var rounds [][]int
	seen := map[string]int{}
	for i, d := range b.docs {
		n := 0
		if d.key != "" {
			n = seen[d.key]
			seen[d.key]++
		}
		for len(rounds) <= n {
			rounds = append(rounds, nil)
		}
		rounds[n] = append(rounds[n], i)
	}
	p.round(b, rounds, 0, make([]int, len(b.docs)), map[string]bool{})
}

func (p *publisher) round(b *pubBatch, rounds [][]int, i int, out []int, stopped map[string]bool) {
	s := p.r.s
	if i == len(rounds) || s.now > b.claimedAt+staleAfter/2 {
		p.settle(b, out)
		return
	}
	var send []int
	for _, j := range rounds[i] {
		if b.behind[j] {
			stopped[b.docs[j].key] = true
			continue
		}
		if k := b.docs[j].key; k == "" || !stopped[k] {
			send = append(send, j)
		}
	}
	waiting, finished := len(send), false
	finish := func() {
		if finished {
			return
		}
		finished = true
		for _, j := range send {
			if out[j] == pending {
				out[j] = timedOut
			}
			if k := b.docs[j].key; out[j] != acked && k != "" {
				stopped[k] = true
			}
		}
		p.round(b, rounds, i+1, out, stopped)
	}
	if waiting == 0 {
		finish()
		return
	}
	for _, j := range send {
		out[j] = pending
		d := b.docs[j]
		delay, lost := s.net()
		if lost {
			continue
		}
		s.at(s.now+delay, nil, func() {
			s.ops++
			res := acked
			if !s.drain {
				if x := s.rng.Float64(); x < s.cfg.pNack {
					res = nacked
				} else if x < s.cfg.pNack+s.cfg.pReturn {
					res = returned
				}
			}
			if res == acked {
				s.or.deliver(d, b)
			}
			back, lost := s.net()
			if lost {
				return
			}
			s.at(s.now+back, p.r, func() {
				if finished {
					return
				}
				out[j] = res
				if res == acked {
					d.m.confirmed = true
				}
				if waiting--; waiting == 0 {
					finish()
				}
			})
		})
	}
	s.at(s.now+publishTimeout, p.r, finish)
}

// settle writes the batch's outcomes (claim/policy.go), each write
// guarded by the claim's worker and token: PUBLISHED for the confirmed;
// a nack or a return backs off (retryAt), or fails once maxAttempts
// claims are used; the rest go back to NEW with the attempt refunded.
// A write that fails is tried again until the batch is stale.
func (p *publisher) settle(b *pubBatch, out []int) {
	r, s := p.r, p.r.s
	var published, retried, refunded []string
	for j, d := range b.docs {
		switch out[j] {
		case acked:
			published = append(published, d.id)
		case nacked, returned:
			retried = append(retried, d.id)
		default:
			refunded = append(refunded, d.id)
		}
	}
	retryAt := r.clock() + s.between(200, 1500)
	writes := []*update{
		{name: "mark", ids: published, set: func(d *doc) { d.status, d.worker, d.token = statusPublished, -1, 0 }},
		{name: "retry", ids: retried, set: func(d *doc) {
			if d.attempts >= s.cfg.maxAttempts {
				d.status, d.lastError, d.failedAt = statusFailed, "nacked or returned by the broker", s.now
			} else {
				d.status, d.retryAt = statusNew, retryAt
			}
			d.worker, d.token = -1, 0
		}},
		{name: "refund", ids: refunded, set: func(d *doc) {
			d.status, d.worker, d.token, d.attempts = statusNew, -1, 0, d.attempts-1
		}},
	}
	writes = slices.DeleteFunc(writes, func(u *update) bool { return len(u.ids) == 0 })
	for _, u := range writes {
		u.match = func(d *doc) bool {
			return d.status == statusProcessing && d.worker == r.id && d.token == b.token
		}
	}
	var step func(i int)
	step = func(i int) {
		if i == len(writes) {
			p.done(b, len(retried)+len(refunded) > 0)
			return
		}
		s.call(r, s.cfg.budget, func(end ms, reply func(any)) { s.db.update(writes[i], end, reply) },
			func(_ any, ok bool) {
				if ok || s.now > b.claimedAt+staleAfter {
					step(i + 1)
					return
				}
				s.after(50, r, func() { step(i) })
			}, nil)
	}
	step(0)
}

// done ends a batch: its keys are free, a put-back drops the read-ahead
// (it sorts before the page), and the next batch starts.
func (p *publisher) done(b *pubBatch, putBack bool) {
	p.r.unhold(b.keys)
	if putBack {
		p.r.ahead.drop()
	}
	p.cur, p.next = p.next, nil
	if p.cur != nil {
		p.start(p.cur)
	}
}
