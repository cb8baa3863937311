package bench

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the child in its own process group, so helpers it spawns
// (Python's manager and workers) can be ended with it, and has the kernel
// kill it if the bench dies first.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the child's process group (its pid, by Setpgid).
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}
