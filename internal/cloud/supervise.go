package cloud

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// SupervisorLog is the supervisor's log in the cloud's directory.
const SupervisorLog = "supervisor.log"

// StartSupervised brings the cloud of spec up in a supervisor process that
// outlives the caller, and returns once every VM runs. command starts the
// supervisor: a process that runs Up with the same spec in the foreground
// and Stop on SIGTERM ('orrery mini serve'). The supervisor's log goes to
// SupervisorLog; its lines are copied to progress as they come.
//
// If ctx ends first (Ctrl-C), StartSupervised stops the supervisor and
// removes everything the cloud created. A supervisor that exits before the
// cloud is up has cleaned up after itself; its log says why.
func StartSupervised(ctx context.Context, spec Spec, command []string, progress io.Writer) (State, error) {
	// A running cloud is the likelier reason to refuse, and it holds the
	// memory and disk Preflight would count as missing.
	if st, err := ReadState(spec.Dir); err == nil && st.Live() {
		return State{}, fmt.Errorf("a local cloud from %s is running: 'orrery mini status' shows it, 'orrery mini stop' or 'orrery mini down' stops it", spec.Dir)
	} else if err == nil {
		return State{}, errRecordedCloud(spec.Dir, st)
	}
	if err := Preflight(spec); err != nil {
		return State{}, fmt.Errorf("this machine cannot run the local cloud yet:\n%w", err)
	}
	if err := makeDir(spec.Dir); err != nil {
		return State{}, err
	}
	return supervise(ctx, spec.Dir, command, progress, spec.ShutdownTimeout, func() error {
		if err := Cleanup(context.Background(), spec.Dir); err != nil {
			return fmt.Errorf("interrupted; cleaning up failed: %w", err)
		}
		return errors.New("interrupted; everything the local cloud created was removed")
	})
}

// ResumeSupervised starts the stopped cloud in dir again in a supervisor
// process, as StartSupervised starts a new one; command runs Resume in
// the foreground until SIGTERM. If ctx ends first, the cloud is stopped
// again and keeps its disks.
func ResumeSupervised(ctx context.Context, dir string, command []string, progress io.Writer) (State, error) {
	st, err := ReadState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return State{}, fmt.Errorf("no local cloud in %s: 'orrery mini up' makes one", dir)
	}
	if err != nil {
		return State{}, err
	}
	if st.Phase != PhaseStopped {
		return State{}, errNotStopped(dir, st)
	}
	if err := preflightStart(st.Spec); err != nil {
		return State{}, fmt.Errorf("this machine cannot run the local cloud yet:\n%w", err)
	}
	return supervise(ctx, dir, command, progress, st.Spec.ShutdownTimeout, func() error {
		if _, err := StopDir(context.Background(), dir); err != nil {
			return fmt.Errorf("interrupted; stopping the VMs failed: %w", err)
		}
		return errors.New("interrupted; the local cloud is stopped again, its disks kept")
	})
}

// supervise starts command as the supervisor of the cloud in dir and
// follows its log until the cloud is up. If ctx ends first, it stops the
// supervisor (which gets shutdownTimeout to power the VMs off) and
// returns what interrupted says.
func supervise(ctx context.Context, dir string, command []string, progress io.Writer, shutdownTimeout time.Duration, interrupted func() error) (State, error) {
	logPath := filepath.Join(dir, SupervisorLog)
	// Appended to: after a crash, the last run's end tells why.
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return State{}, fmt.Errorf("open the supervisor's log: %w", err)
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s: %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(command, " "))
	// What is in the log so far is not this run's progress.
	from, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return State{}, err
	}
	sup := exec.Command(command[0], command[1:]...) //nolint:noctx // the supervisor outlives the caller by design
	sup.Stdout, sup.Stderr = logFile, logFile
	// Its own session: the supervisor outlives the caller and a Ctrl-C in
	// the caller's terminal, which StartSupervised turns into an orderly
	// stop.
	sup.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sup.Start(); err != nil {
		return State{}, fmt.Errorf("start the supervisor: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sup.Wait() }()
	fmt.Fprintf(progress, "Starting the local cloud in %s (log: %s)\n", dir, logPath)
	st, err := followUntilUp(ctx, dir, logPath, from, exited, progress)
	if err == nil {
		return st, nil
	}
	if ctx.Err() == nil {
		return State{}, err
	}
	fmt.Fprintln(progress, "Interrupted: stopping the local cloud...")
	_ = sup.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited: //nolint:errcheck // its exit status is in its log
	case <-time.After(time.Minute + shutdownTimeout):
		_ = sup.Process.Kill()
	}
	return State{}, interrupted()
}

// followUntilUp copies the supervisor's log to progress until the cloud's
// state says it is up, the supervisor exits, or ctx ends.
func followUntilUp(ctx context.Context, dir, logPath string, from int64, exited <-chan error, progress io.Writer) (State, error) {
	follow, err := os.Open(logPath)
	if err != nil {
		return State{}, err
	}
	defer follow.Close()
	if _, err := follow.Seek(from, io.SeekStart); err != nil {
		return State{}, err
	}
	lines := bufio.NewReader(follow)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		copyLines(lines, follow, progress)
		if st, err := ReadState(dir); err == nil && st.Phase == PhaseUp {
			return st, nil
		}
		select {
		case err := <-exited:
			// Its last lines say why.
			copyLines(lines, follow, progress)
			return State{}, fmt.Errorf("the supervisor stopped before the cloud was up (%v); see %s", err, logPath)
		case <-ctx.Done():
			return State{}, ctx.Err()
		case <-tick.C:
		}
	}
}

// copyLines copies the whole lines that are in the log so far; a partial
// line stays for the next round.
func copyLines(lines *bufio.Reader, f *os.File, progress io.Writer) {
	for {
		line, err := lines.ReadString('\n')
		if err != nil {
			if len(line) > 0 {
				_, _ = f.Seek(-int64(len(line)), io.SeekCurrent)
				lines.Reset(f)
			}
			return
		}
		fmt.Fprint(progress, "  ", line)
	}
}
