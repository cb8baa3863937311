//go:build !linux

package bench

import "os/exec"

// setProcAttr: without Linux's Pdeathsig and a portable process-group kill,
// children are ended one by one (see killGroup).
func setProcAttr(cmd *exec.Cmd) {}

// killGroup kills only the child itself off Linux.
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	return cmd.Process.Kill()
}
