package cloud

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/clusternet"

	"github.com/orrery-dev/orrery/internal/cloud/vm"
)

// State is what the state file records of a running cloud: enough for
// `orrery mini status`, and for Cleanup to find everything a crashed run
// left behind.
type State struct {
	Namespace string    `json:"namespace,omitempty"`
	Bridge    string    `json:"bridge"`
	Accel     vm.Accel  `json:"accel"`
	Started   time.Time `json:"started"`
	// Stopped is when the cloud was stopped, in PhaseStopped.
	Stopped time.Time `json:"stopped,omitzero"`
	Nodes   []*Node   `json:"nodes"`
	// SupervisorPID is the process that runs the cloud's services; zero
	// when none does.
	SupervisorPID int `json:"supervisorPID"`
	// Phase is PhaseStarting until every VM runs, then PhaseUp; after
	// Stop, PhaseStopped.
	Phase string `json:"phase"`
	// Spec is what the cloud was made with, for Resume.
	Spec Spec `json:"spec"`
	// KeepLogs says the owner asked to keep the serial logs.
	KeepLogs bool `json:"keepLogs,omitempty"`
	// Endpoint is the load balancer in front of the control planes'
	// API servers, the cluster's stable endpoint.
	Endpoint netip.AddrPort `json:"endpoint,omitzero"`
}

// Phases of a cloud in the state file.
const (
	PhaseStarting = "starting"
	PhaseUp       = "up"
)

// Live reports whether any VM process of the recorded cloud still runs.
func (st State) Live() bool { return st.live() }

func (c *Cloud) writeState() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := State{
		Namespace:     c.spec.Namespace,
		Bridge:        c.spec.Bridge,
		Accel:         c.accel,
		Started:       c.started,
		Nodes:         c.nodes,
		SupervisorPID: os.Getpid(),
		Phase:         c.phase,
		KeepLogs:      c.spec.KeepLogs,
		Spec:          c.spec,
		Endpoint:      netip.AddrPortFrom(LoadBalancerIP, clusternet.APIServerPort),
	}
	if c.phase == PhaseStopped {
		// No process may be signalled on the cloud's behalf: its PID may
		// be another's by the time anyone reads this.
		st.Stopped, st.SupervisorPID = c.stopped, 0
	}
	return writeStateFile(c.spec.Dir, st)
}

func writeStateFile(dir string, st State) error {
	raw, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, StateFile)
	if err := os.WriteFile(path+".tmp", raw, 0o600); err != nil {
		return fmt.Errorf("write state file: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

// ReadState reads the state file in dir.
func ReadState(dir string) (State, error) { return readState(dir) }

func readState(dir string) (State, error) {
	var st State
	if err := CheckDir(dir); err != nil {
		return st, err
	}
	path := filepath.Join(dir, StateFile)
	if fi, err := os.Lstat(path); err != nil {
		return st, err
	} else if !fi.Mode().IsRegular() {
		return st, fmt.Errorf("state file %s is not a regular file (%s): remove it", path, fi.Mode().Type())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("state file %s is damaged (%v): remove it after checking no VM of it runs", path, err)
	}
	if err := st.checkNodeDirs(dir); err != nil {
		return State{}, fmt.Errorf("state file %s: %w: it was not written by orrery mini; remove the directory after checking no VM of it runs", path, err)
	}
	return st, nil
}

// ErrNotOwnDir is wrapped by CheckDir's refusal.
var ErrNotOwnDir = errors.New("not a local cloud's directory of this user")

// CheckDir checks that dir can be a local cloud's directory: a directory
// itself (not a link), owned by this user or root, that no one else may
// enter, as Up makes it (mode 0700). The commands that read a cloud's
// state act on what it names: the VMs' directories they delete (as root),
// the processes they signal, the platform CA whose keys the owner trusts.
// A directory of that name planted where they run (a checkout's
// orrery-mini/, made 0755 by git) must be none of those.
func CheckDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s: %w: it is not a directory (%s)", dir, ErrNotOwnDir, fi.Mode().Type())
	case !ok || (int(st.Uid) != os.Geteuid() && st.Uid != 0):
		return fmt.Errorf("%s: %w: another user owns it; pass the directory 'orrery mini up' made with --mini-dir", dir, ErrNotOwnDir)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%s: %w: its mode is %#o, and 'orrery mini up' makes it %#o: a directory others may read or write, or one a checkout planted, is not trusted for the VMs it names or the platform CA it holds; "+
			"remove it, or pass the right one with --mini-dir", dir, ErrNotOwnDir, fi.Mode().Perm(), 0o700)
	}
	return nil
}

// makeDir makes dir the cloud's directory: created mode 0700, or, if it
// exists and records no cloud yet, tightened to that; one that records a
// cloud must pass CheckDir as it is.
func makeDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the cloud's directory: %w", err)
	}
	err := CheckDir(dir)
	if err == nil || !errors.Is(err, ErrNotOwnDir) {
		return err
	}
	if _, serr := os.Lstat(filepath.Join(dir, StateFile)); !errors.Is(serr, os.ErrNotExist) {
		return err
	}
	fi, lerr := os.Lstat(dir)
	if lerr != nil || !fi.IsDir() {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || (int(st.Uid) != os.Geteuid() && st.Uid != 0) {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// checkNodeDirs checks that every node's directory is the cloud's own
// directory for that node, as Up names them: Cleanup deletes them.
func (st State) checkNodeDirs(dir string) error {
	base := st.Spec.Dir
	if base == "" {
		base, _ = filepath.Abs(dir)
	}
	for _, n := range st.Nodes {
		if n == nil || !validNodeName(n.Name) || filepath.Clean(n.Dir) != filepath.Join(base, n.Name) {
			return fmt.Errorf("a node's directory is not the cloud's own directory for it")
		}
	}
	return nil
}

// validNodeName is a name Up gives a VM: lower-case letters, digits and
// dashes.
func validNodeName(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	for _, r := range name {
		if !(r == '-' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9') {
			return false
		}
	}
	return true
}

// live reports whether any process of the recorded cloud still runs.
func (st State) live() bool {
	for _, n := range st.Nodes {
		if len(processesUsing(n.Dir)) > 0 {
			return true
		}
	}
	return false
}

// processesUsing lists the PIDs whose command line mentions dir: the QEMU
// and swtpm processes of a VM all name files in the VM's directory.
func processesUsing(dir string) []int {
	if dir == "" {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if strings.Contains(string(arg), dir+"/") || string(arg) == dir {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// Cleanup removes what a cloud recorded in dir's state file: its VMs'
// processes (asking its supervisor to stop first), the network and the
// VMs' files. It is what `orrery mini down` does, and it works after a
// crash as well. A directory without a state file has nothing to clean.
func Cleanup(ctx context.Context, dir string) error {
	st, err := readState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	st, unlock, err := halt(ctx, dir, st)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if unlock == nil {
		return err
	}
	defer unlock()
	errs := []error{err}
	for _, n := range st.Nodes {
		errs = append(errs, removeNodeDir(n.Dir, st.KeepLogs))
	}
	errs = append(errs, removeNodeDir(filepath.Join(dir, LoadBalancerDir), st.KeepLogs))
	errs = append(errs, removeRunFiles(dir), removeIfExists(filepath.Join(dir, LockFile)))
	return errors.Join(errs...)
}

// stopSupervisor asks the cloud's supervisor, if one runs, to stop the
// cloud, and waits until it has exited; it reports whether one ran.
func stopSupervisor(dir string, st State) bool {
	pid := st.SupervisorPID
	if pid <= 0 || pid == os.Getpid() || !supervises(pid, dir, st) || syscall.Kill(pid, syscall.SIGTERM) != nil {
		return false
	}
	// It waits up to the VMs' shutdown timeout (30 s by default) before
	// it kills them; acting beside it would race it.
	deadline := time.Now().Add(2*time.Minute + st.Spec.ShutdownTimeout)
	for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
		time.Sleep(100 * time.Millisecond)
	}
	// A supervisor that hangs still holds the cloud's lock.
	if syscall.Kill(pid, syscall.SIGKILL) == nil {
		for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return true
}

// supervises reports whether process pid is the supervisor of the cloud
// in dir, whose command line names the cloud's directory: after a crash
// the recorded PID may be another process's by now.
func supervises(pid int, dir string, st State) bool {
	want := st.Spec.Dir
	if want == "" {
		want, _ = filepath.Abs(dir)
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(cmdline), "\x00"), want)
}

// killVMs kills whatever processes of the recorded VMs still run, as a
// power cut would.
func killVMs(st State) []error {
	var errs []error
	for _, n := range st.Nodes {
		for _, pid := range processesUsing(n.Dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// The load balancer dies with its supervisor (Pdeathsig), unless
	// that was killed at a bad moment.
	if st.Spec.Dir != "" {
		for _, pid := range processesUsing(filepath.Join(st.Spec.Dir, LoadBalancerDir)) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, n := range st.Nodes {
		for i := 0; i < 50 && len(processesUsing(n.Dir)) > 0; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if pids := processesUsing(n.Dir); len(pids) > 0 {
			errs = append(errs, fmt.Errorf("processes %v of VM %s survive SIGKILL", pids, n.Name))
		}
	}
	return errs
}

// ProcessesUsing lists the processes whose command line names dir or a
// file in it (a VM's QEMU and swtpm).
func ProcessesUsing(dir string) []int { return processesUsing(dir) }

// Uptime is how long the node's QEMU process has run; false if it does
// not run.
func (n *Node) Uptime() (time.Duration, bool) {
	if n.PID <= 0 || !slices.Contains(processesUsing(n.Dir), n.PID) {
		return 0, false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(n.PID), "stat"))
	if err != nil {
		return 0, false
	}
	// Field 22 (starttime, in clock ticks since boot) follows the command
	// name, which may contain spaces but ends at the last ')'.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 20 {
		return 0, false
	}
	ticks, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, false
	}
	var info unix.Sysinfo_t
	if err := unix.Sysinfo(&info); err != nil {
		return 0, false
	}
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(info.Uptime)*time.Second - time.Duration(ticks)*time.Second/clockTicks, true
}
