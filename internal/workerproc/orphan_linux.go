package workerproc

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the worker when the process that
// started it dies: a test binary that panics at its -timeout runs no
// cleanup, and its workers would otherwise relay on, holding partitions
// and load, into the next run on the same host.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
