package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
)

// busyLoops starts n processes that spin on a core each, as a busy host's
// neighbours would, and returns the func that stops them. The raw loop and
// the workers of a busy stage run beside them, so that the ratio compares
// both under the same load.
func busyLoops(ctx context.Context, n int) (stop func(), err error) {
	var procs []*exec.Cmd
	stop = func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}
	for range n {
		p := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		p.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the harness
		if err := p.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("start a busy loop: %w", err)
		}
		procs = append(procs, p)
	}
	return stop, nil
}

// Timeouts is what a worker's log and metrics say of its claims and its
// sampler on a slow or busy database.
type Timeouts struct {
	// Claims is how many times a claim or an outcome write timed out (the
	// worker's "database timed out" warnings); LowestLimit the smallest
	// batch limit they left, 0 when none did.
	Claims      int `json:"claims"`
	LowestLimit int `json:"lowestLimit,omitempty"`
	// Repeats counts timeouts that left the limit where the one before
	// left it: the same size timed out twice (in a row, or after the limit
	// had grown back to it). Every timeout halves the limit, so a claim
	// that times out again at the same size is a claim that cannot finish.
	Repeats int `json:"repeats"`
	// SamplerErrors are the sampler's failed runs
	// (outbox_job_errors_total{job="sampler"}), SamplerLeftOut its runs
	// left out while claims were slow.
	SamplerErrors  int `json:"samplerErrors"`
	SamplerLeftOut int `json:"samplerLeftOut"`
}

// timeoutLine matches the worker's warning after a timeout, in the text
// format, and the batch limit it left.
var timeoutLine = regexp.MustCompile(`msg="database timed out; claiming smaller batches".* batch_limit=([0-9]+)`)

// loggedTimeouts reads the timeouts from the worker's log at logPath.
func loggedTimeouts(logPath string) (Timeouts, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return Timeouts{}, err
	}
	defer f.Close()
	var t Timeouts
	last := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		m := timeoutLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		limit, _ := strconv.Atoi(m[1])
		t.Claims++
		if limit == last {
			t.Repeats++
		}
		if t.LowestLimit == 0 || limit < t.LowestLimit {
			t.LowestLimit = limit
		}
		last = limit
	}
	return t, sc.Err()
}

// describe is the timeouts in a few words, for the table.
func (t Timeouts) describe() string {
	claims := "no claim timed out"
	if t.Claims > 0 {
		claims = fmt.Sprintf("%d claim or write timeouts, the batch limit down to %d at the lowest, %d at a size that had timed out before",
			t.Claims, t.LowestLimit, t.Repeats)
	}
	return fmt.Sprintf("%s; sampler: %d failed runs, %d left out while claims were slow", claims, t.SamplerErrors, t.SamplerLeftOut)
}
