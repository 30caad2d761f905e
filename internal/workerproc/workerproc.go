// Package workerproc runs the worker binary as a child process, its output
// in a log file: the one process runner of the end-to-end tests and of the
// benchmark harness, which both start, signal, stop and read the log of
// real worker processes.
package workerproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Config says which process to start.
type Config struct {
	// Bin is the path of the worker binary. Required.
	Bin string
	// Name names the process in errors. Required.
	Name string
	// Args are the binary's arguments. Defaults to "run".
	Args []string
	// Env is the process's whole environment, KEY=VALUE; see Environ.
	Env []string
	// LogPath is the file that gets the process's standard output and
	// error. Required.
	LogPath string
}

// Proc is one running (or exited) worker process.
type Proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited
}

// Start starts the process and returns at once; a goroutine waits for its
// exit and closes its log.
func Start(cfg Config) (*Proc, error) {
	if cfg.Bin == "" || cfg.Name == "" || cfg.LogPath == "" {
		return nil, errors.New("workerproc: Bin, Name and LogPath are required")
	}
	args := cfg.Args
	if len(args) == 0 {
		args = []string{"run"}
	}
	logFile, err := os.Create(cfg.LogPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(cfg.Bin, args...) //nolint:noctx // the process outlives this call: Stop and Kill end it
	cmd.Env = cfg.Env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", cfg.Name, err)
	}
	p := &Proc{name: cfg.Name, logPath: cfg.LogPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is read from cmd.ProcessState
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Name is Config.Name.
func (p *Proc) Name() string { return p.name }

// LogPath is Config.LogPath.
func (p *Proc) LogPath() string { return p.logPath }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig, or reports that the process has already exited.
func (p *Proc) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s has exited (%v) before %v", p.name, p.cmd.ProcessState, sig)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	return nil
}

// Wait waits up to timeout for the process to exit and returns its state,
// or nil and false if it still runs.
func (p *Proc) Wait(timeout time.Duration) (*os.ProcessState, bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState, true
	case <-timer.C:
		return nil, false
	}
}

// Stop sends SIGTERM and waits up to timeout for the process to exit; one
// that does not is killed and reported, with a nil state. A non-zero exit
// code is reported too, with the state.
func (p *Proc) Stop(timeout time.Duration) (*os.ProcessState, error) {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		<-p.done
		return p.cmd.ProcessState, err
	}
	state, exited := p.Wait(timeout)
	if !exited {
		p.Kill()
		return nil, fmt.Errorf("%s still running %s after SIGTERM", p.name, timeout)
	}
	if code := state.ExitCode(); code != 0 {
		return state, fmt.Errorf("%s exited with code %d after SIGTERM, want 0", p.name, code)
	}
	return state, nil
}

// Kill ends the process if it still runs and waits for it: for what a
// failed test or stage leaves behind.
func (p *Proc) Kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Tail returns the last n lines of the process's log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// LogSize is how many bytes the process has logged so far: a mark for
// LogSince.
func (p *Proc) LogSize() int64 {
	fi, err := os.Stat(p.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// LogSince returns what the process logged after the mark LogSize gave.
func (p *Proc) LogSince(mark int64) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	return string(b[min(mark, int64(len(b))):])
}

// Environ is this process's environment without any OUTBOX_ variable,
// so that the caller's shell does not leak settings into the worker, plus
// env in a stable order.
func Environ(env map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			out = append(out, kv)
		}
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago, for a worker's OUTBOX_HTTP_ADDR.
func FreeAddr() (string, error) {
	ln, err := new(net.ListenConfig).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
