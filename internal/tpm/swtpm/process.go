package swtpm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/orrery-dev/orrery/internal/childproc"
)

// stopTimeout is how long Stop gives swtpm to save its state after SIGTERM
// before it kills it.
const stopTimeout = 5 * time.Second

// process is one running swtpm, whatever it serves: its state directory,
// a short private directory for its sockets, and its exit.
type process struct {
	stateDir string
	sockDir  string
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
}

// launch starts swtpm on stateDir with the arguments both modes share plus
// channels(sockDir), the mode's socket arguments, and then waits with ready
// until the mode's socket is usable. On failure nothing is left running.
func launch(ctx context.Context, stateDir string, channels func(sockDir string) []string, ready func(pid int) (bool, error)) (*process, error) {
	path, err := exec.LookPath(Binary)
	if err != nil {
		return nil, fmt.Errorf("swtpm not found in PATH: install it with 'make deps' (Debian package swtpm): %w", err)
	}
	// swtpm splits its option values at commas, with no escape: a comma in
	// the state directory made it exit at once, its log (in that
	// directory) unwritten.
	if strings.Contains(stateDir, ",") {
		return nil, fmt.Errorf("swtpm state directory %q contains a comma, which swtpm cannot take in a path: use a directory without one", stateDir)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create swtpm state directory: %w", err)
	}
	// Unix socket paths are limited to 108 bytes; test temp dirs can be long,
	// so the sockets live in a short private directory of their own.
	sockDir, err := os.MkdirTemp("", "swtpm-")
	if err != nil {
		return nil, fmt.Errorf("create swtpm socket directory: %w", err)
	}
	p := &process{stateDir: stateDir, sockDir: sockDir, exited: make(chan struct{})}
	args := append([]string{"socket", "--tpm2", "--tpmstate", "dir=" + stateDir}, channels(sockDir)...)
	p.cmd = exec.Command(path, append(args, //nolint:noctx // stopped by Stop with SIGTERM, so that it saves its state, not by a context
		"--log", "file="+filepath.Join(stateDir, "swtpm.log"))...)
	// SIGTERM when we die lets swtpm save its state; its own process group
	// keeps a terminal's Ctrl-C from stopping it before its owner does.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	// childproc: a plain Start would tie the SIGTERM to whichever thread
	// forked, and a network-namespace helper may end that thread.
	wait, err := childproc.Start(p.cmd)
	if err != nil {
		os.RemoveAll(sockDir)
		return nil, fmt.Errorf("start swtpm: %w", err)
	}
	go func() {
		p.waitErr = <-wait
		os.RemoveAll(sockDir)
		close(p.exited)
	}()
	if err := p.waitReady(ctx, ready); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *process) waitReady(ctx context.Context, ready func(pid int) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ok, err := ready(p.cmd.Process.Pid)
		if ok {
			return nil
		}
		select {
		case <-p.exited:
			log, _ := os.ReadFile(filepath.Join(p.stateDir, "swtpm.log"))
			return fmt.Errorf("swtpm exited during start-up (%v); its log says: %s", p.waitErr, log)
		case <-ctx.Done():
			return fmt.Errorf("swtpm is not ready in time (%v): %w", err, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// StateDir is the directory holding the TPM's persistent state.
func (p *process) StateDir() string { return p.stateDir }

// stop sends SIGTERM, so that swtpm saves its state, and SIGKILL if it has
// not exited after stopTimeout; it waits until the process is gone and
// reports whether it had to kill it.
func (p *process) stop() (killed bool) {
	select {
	case <-p.exited:
		return false
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return false
	case <-time.After(stopTimeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	return true
}
