package swtpm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// stopTimeout is how long Stop gives swtpm to save its state after SIGTERM
// before it kills it.
const stopTimeout = 5 * time.Second

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
	stateDir string
	sockDir  string
	ctrl     string
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
}

// StartForQEMU launches swtpm for a QEMU VM with its TPM state in stateDir
// (created if missing; an existing state, e.g. one provisioned with Start,
// is used) and its log in stateDir/swtpm.log, and waits until the control
// socket accepts connections or ctx ends. Give QEMU CtrlSocket as
// -chardev socket,path=...
func StartForQEMU(ctx context.Context, stateDir string) (*QEMUInstance, error) {
	path, err := exec.LookPath(Binary)
	if err != nil {
		return nil, fmt.Errorf("swtpm not found in PATH: install it with 'make deps' (Debian package swtpm): %w", err)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create swtpm state directory: %w", err)
	}
	// As in Start: the socket lives in a short directory of its own, since
	// Unix socket paths are limited to 108 bytes.
	sockDir, err := os.MkdirTemp("", "swtpm-")
	if err != nil {
		return nil, fmt.Errorf("create swtpm socket directory: %w", err)
	}
	in := &QEMUInstance{
		stateDir: stateDir,
		sockDir:  sockDir,
		ctrl:     filepath.Join(sockDir, "ctrl.sock"),
		exited:   make(chan struct{}),
	}
	// No --server and no not-need-init: QEMU sends the data channel and
	// CMD_INIT over the control socket itself, at every VM (re)start.
	in.cmd = exec.Command(path, "socket", "--tpm2",
		"--tpmstate", "dir="+stateDir,
		"--ctrl", "type=unixio,path="+in.ctrl,
		"--log", "file="+filepath.Join(stateDir, "swtpm.log"),
	)
	// SIGTERM when we die lets swtpm save its state; its own process group
	// keeps a terminal's Ctrl-C from stopping it before QEMU.
	in.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := in.cmd.Start(); err != nil {
		os.RemoveAll(sockDir)
		return nil, fmt.Errorf("start swtpm: %w", err)
	}
	go func() {
		in.waitErr = in.cmd.Wait()
		os.RemoveAll(sockDir)
		close(in.exited)
	}()
	if err := in.waitReady(ctx); err != nil {
		in.Stop()
		return nil, err
	}
	return in, nil
}

// waitReady waits until the control socket exists. It does not connect:
// swtpm serves a single control connection, and that one is QEMU's.
func (in *QEMUInstance) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if fi, err := os.Stat(in.ctrl); err == nil && fi.Mode().Type() == os.ModeSocket {
			return nil
		}
		select {
		case <-in.exited:
			log, _ := os.ReadFile(filepath.Join(in.stateDir, "swtpm.log"))
			return fmt.Errorf("swtpm exited during start-up (%v); its log says: %s", in.waitErr, log)
		case <-ctx.Done():
			return fmt.Errorf("swtpm did not create %s in time: %w", in.ctrl, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// CtrlSocket is the path of the control socket to hand to QEMU.
func (in *QEMUInstance) CtrlSocket() string { return in.ctrl }

// StateDir is the directory holding the TPM's persistent state.
func (in *QEMUInstance) StateDir() string { return in.stateDir }

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
	select {
	case <-in.exited:
		return nil
	default:
	}
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.exited:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = in.cmd.Process.Kill()
	<-in.exited
	return fmt.Errorf("swtpm ignored SIGTERM for %v and was killed; its state may be stale", stopTimeout)
}
