package swtpm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// QEMUInstance is a swtpm process serving one QEMU VM as the backend of its
// TPM device (QEMU's -tpmdev emulator). QEMU initialises the TPM through
// the control socket and sends TPM commands over a channel it passes there,
// so, unlike Instance, it has no socket for Go code.
//
// swtpm 0.7.1 exits by itself when QEMU ends in order (QEMU sends
// CMD_SHUTDOWN on its way out: guest power-off, QMP quit, SIGTERM), but not
// when QEMU is killed with SIGKILL or crashes: then swtpm only notes that its
// client went away and keeps running until Stop. Call Stop in any case.
type QEMUInstance struct {
	*process
	ctrl string
}

// StartForQEMU launches swtpm for a QEMU VM with its TPM state in stateDir
// (created if missing; an existing state, e.g. one provisioned with Start,
// is used) and its log in stateDir/swtpm.log, and waits until the control
// socket accepts connections or ctx ends. Give QEMU CtrlSocket as
// -chardev socket,path=...
func StartForQEMU(ctx context.Context, stateDir string) (*QEMUInstance, error) {
	in := &QEMUInstance{}
	// No --server and no not-need-init: QEMU sends the data channel and
	// CMD_INIT over the control socket itself, at every VM (re)start.
	p, err := launch(ctx, stateDir, func(sockDir string) []string {
		in.ctrl = filepath.Join(sockDir, "ctrl.sock")
		return []string{"--ctrl", "type=unixio,path=" + in.ctrl}
	}, func(pid int) (bool, error) {
		// Only look, never connect: swtpm serves a single control
		// connection, and that one is QEMU's.
		return listening(pid, in.ctrl)
	})
	if err != nil {
		return nil, err
	}
	in.process = p
	return in, nil
}

// CtrlSocket is the path of the control socket to hand to QEMU.
func (in *QEMUInstance) CtrlSocket() string { return in.ctrl }

// PID is swtpm's process ID.
func (in *QEMUInstance) PID() int { return in.cmd.Process.Pid }

// Exited is closed when swtpm has exited.
func (in *QEMUInstance) Exited() <-chan struct{} { return in.exited }

// Wait waits until swtpm exits, or ctx ends, and returns how it exited: nil
// for a clean exit, also one after Stop's SIGTERM.
func (in *QEMUInstance) Wait(ctx context.Context) error {
	select {
	case <-in.exited:
	case <-ctx.Done():
		return ctx.Err()
	}
	var exit *exec.ExitError
	if errors.As(in.waitErr, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if in.waitErr != nil {
		return fmt.Errorf("swtpm: %w (see %s)", in.waitErr, filepath.Join(in.stateDir, "swtpm.log"))
	}
	return nil
}

// Stop ends swtpm, whether or not it is still running: SIGTERM, so that it
// saves its state, and SIGKILL if it has not exited after a few seconds. It
// waits until the process is gone.
func (in *QEMUInstance) Stop() error {
	if in.stop() {
		return fmt.Errorf("swtpm ignored SIGTERM for %v and was killed; its state may be stale", stopTimeout)
	}
	return nil
}

// listening reports whether process pid's Unix socket at path accepts
// connections, from the socket table of pid's network namespace: the
// socket file appears at bind(), before listen(), and a client that
// connects in between is refused. (Not /proc/self/net: that is the network
// namespace of this process's main thread, which need not be swtpm's.)
func listening(pid int, path string) (bool, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		// Num RefCount Protocol Flags Type St Inode Path; Flags 00010000
		// is __SO_ACCEPTCON, set by listen().
		if len(f) == 8 && f[7] == path && f[3] == "00010000" {
			return true, nil
		}
	}
	return false, fmt.Errorf("%s is not listening yet", path)
}
