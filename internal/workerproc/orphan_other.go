//go:build !linux

package workerproc

import "os/exec"

// dieWithParent does nothing where the kernel cannot tie a child's life
// to its parent's; Stop and Kill still end it.
func dieWithParent(*exec.Cmd) {}
