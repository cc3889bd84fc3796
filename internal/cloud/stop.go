package cloud

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/orrery-dev/orrery/internal/cloud/netenv"
)

// A stopped cloud keeps every file: the VMs' disks, UEFI variables and
// vTPMs, the init secret, the platform CA, the simulated SEV-SNP chip and
// the state file with the node plan. Starting it again boots the same VMs
// under the same names, MACs and addresses, with the same attestation
// keys, so that the cluster on their disks sees its own nodes come back.

// PhaseStopped is the phase of a cloud whose VMs were powered off with
// their disks kept.
const PhaseStopped = "stopped"

// errRecordedCloud refuses to make a new cloud where st records one that
// does not run: its VMs' disks are still there.
func errRecordedCloud(dir string, st State) error {
	if st.Phase == PhaseStopped {
		return fmt.Errorf("a stopped local cloud is in %s: 'orrery mini start' boots its VMs again, 'orrery mini down' deletes them", dir)
	}
	return fmt.Errorf("a local cloud in %s ended without stopping (its supervisor is gone): 'orrery mini stop' keeps its disks ('orrery mini start' then boots them again), 'orrery mini down' deletes them", dir)
}

// Stop powers the VMs off and stops the network and the services, and
// keeps every file; Start boots the same VMs again. The cloud keeps its
// directory's lock until Down, or until the process ends.
func (c *Cloud) Stop(ctx context.Context) error {
	errs := c.stopRunning(ctx)
	c.phase, c.stopped = PhaseStopped, time.Now()
	errs = append(errs, c.writeState())
	c.progress("stopped; the VMs' disks are kept")
	return errors.Join(errs...)
}

// Start boots the VMs of a stopped cloud from their kept disks. If it
// fails, the cloud is stopped again with its files.
func (c *Cloud) Start(ctx context.Context) (err error) {
	if c.phase != PhaseStopped {
		return fmt.Errorf("cloud: start: the cloud is %s, not stopped", c.phase)
	}
	c.started, c.phase = time.Now(), PhaseStarting
	c.mu.Lock()
	c.leases, c.leased = map[string]bool{}, make(chan struct{})
	c.mu.Unlock()
	defer func() {
		if err != nil {
			c.progress("start failed, stopping again (the disks are kept): %v", err)
			_ = c.Stop(context.Background())
		}
	}()
	hash, err := c.keptInitSecret()
	if err != nil {
		return err
	}
	if err := c.boot(ctx, hash); err != nil {
		return err
	}
	c.progress("up: %d VMs started from their kept disks in %s", len(c.nodes), time.Since(c.started).Round(100*time.Millisecond))
	return nil
}

// keptInitSecret returns the bcrypt hash of the init secret Up made: a
// node not initialised yet still expects its owner to know it.
func (c *Cloud) keptInitSecret() ([]byte, error) {
	raw, err := os.ReadFile(filepath.Join(c.spec.Dir, InitSecretFile))
	if err != nil {
		return nil, fmt.Errorf("init secret of the stopped cloud: %w", err)
	}
	if len(raw) == 0 || raw[len(raw)-1] != '\n' {
		return nil, fmt.Errorf("init secret %s is damaged: 'orrery mini down' and 'orrery mini up' make a new cloud", filepath.Join(c.spec.Dir, InitSecretFile))
	}
	return bcrypt.GenerateFromPassword(raw[:len(raw)-1], bcrypt.DefaultCost)
}

// Resume starts the stopped cloud recorded in dir again, in this process;
// progress receives one line per step.
func Resume(ctx context.Context, dir string, progress io.Writer) (_ *Cloud, err error) {
	st, err := readState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no local cloud in %s: 'orrery mini up' makes one", dir)
	}
	if err != nil {
		return nil, err
	}
	if st.Phase != PhaseStopped {
		return nil, errNotStopped(dir, st)
	}
	spec := st.Spec
	spec.Progress = progress
	if spec.Dir != dir {
		abs, _ := filepath.Abs(dir)
		if spec.Dir != abs {
			return nil, fmt.Errorf("the state file in %s records the cloud of %s: was the directory moved? A cloud's VMs must stay where they were made", dir, spec.Dir)
		}
	}
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("state file %s: %w", filepath.Join(dir, StateFile), err)
	}
	c := &Cloud{spec: spec, started: time.Now(), phase: PhaseStopped, nodes: st.Nodes, stopped: st.Stopped}
	if err := c.takeLock(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.lock.Close()
		}
	}()
	// The state was read before the lock was taken: another command may
	// have changed it in between.
	if now, err := readState(dir); err != nil || now.Phase != PhaseStopped {
		return nil, fmt.Errorf("the local cloud in %s changed while it was being started (%v): run 'orrery mini status' and try again", dir, err)
	}
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// errNotStopped explains why the cloud in dir cannot be started.
func errNotStopped(dir string, st State) error {
	if st.live() {
		return fmt.Errorf("the local cloud in %s runs already: 'orrery mini status' shows it", dir)
	}
	return errRecordedCloud(dir, st)
}

// imageStamp identifies the contents of a disk image cheaply: its size
// and modification time. Empty for a cloud that boots a kernel.
func imageStamp(image string) (string, error) {
	if image == "" {
		return "", nil
	}
	fi, err := os.Stat(image)
	if err != nil {
		return "", fmt.Errorf("image: %w", err)
	}
	return fmt.Sprintf("%d bytes, modified %s", fi.Size(), fi.ModTime().UTC().Format(time.RFC3339Nano)), nil
}

// StopDir stops the cloud recorded in dir and keeps its files, so that
// Resume boots the same VMs again. Its supervisor stops the VMs in order;
// after a crash, StopDir kills what is left itself, as a power cut would.
// It reports whether the cloud was stopped already.
func StopDir(ctx context.Context, dir string) (alreadyStopped bool, err error) {
	st, err := readState(dir)
	if err != nil {
		return false, err
	}
	if st.Phase == PhaseStopped {
		return true, nil
	}
	st, unlock, err := halt(ctx, dir, st)
	if errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("the local cloud in %s was still starting: its supervisor removed what it had made", dir)
	}
	if unlock != nil {
		defer unlock()
	}
	if err != nil || st.Phase == PhaseStopped {
		return false, err
	}
	for _, n := range st.Nodes {
		n.PID = 0
	}
	st.Phase, st.Stopped, st.SupervisorPID = PhaseStopped, time.Now(), 0
	return false, writeStateFile(dir, st)
}

// halt ends what runs of the cloud recorded as st in dir: its supervisor,
// if one runs, stops the VMs in order; what is left after a crash is
// killed, as a power cut would, and the network removed. It returns the
// state as it is then and holds the cloud's lock (unlock releases it, nil
// if the lock was not taken). A cloud whose supervisor removed it, because
// it was still starting, gives os.ErrNotExist.
func halt(ctx context.Context, dir string, st State) (now State, unlock func(), err error) {
	if stopSupervisor(dir, st) {
		if st, err = readState(dir); err != nil {
			return st, nil, err
		}
	}
	if unlock, err = lockIdle(dir); err != nil {
		return st, nil, err
	}
	if st.Phase == PhaseStopped {
		return st, unlock, nil
	}
	errs := killVMs(st)
	if err := netenv.Cleanup(ctx, st.Namespace, st.Bridge, tapPrefix(st.Bridge)); err != nil {
		errs = append(errs, err)
	}
	return st, unlock, errors.Join(errs...)
}

// lockIdle takes the lock of the cloud in dir, which no supervisor holds
// any more, so that no 'mini start' or 'mini up' begins while files are
// changed under it; unlock releases it.
func lockIdle(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another 'orrery mini' command is at work on %s: wait for it to end, then run this again", dir)
	}
	return func() { f.Close() }, nil
}
