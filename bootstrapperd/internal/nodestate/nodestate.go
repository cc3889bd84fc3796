// Package nodestate is what bootstrapperd decides from when it starts,
// read in one place, and the one writer of the end of bootstrapping.
//
// Four things say where a node stands, and each is written at a known
// point of the init and join paths:
//
//   - the node lock (PCR 15, internal/nodelock): taken by an init or a
//     join at its point of no return, and by the initrd on every later
//     boot of a node that belongs to a cluster;
//   - an init's records on the state disk (internal/initserver): its
//     request just before the lock, its result once it is done;
//   - a join's kept ticket (internal/pendingjoin): from just before the
//     lock until kubeadm join has finished;
//   - the bootstrapped marker: written last, once the node belongs to a
//     cluster by either path (MarkBootstrapped).
//
// Load reads them and Next says what the daemon does. Crashes between
// those writes leave combinations that Next resolves: a record of an
// init or join that never took the lock is replaced by the next attempt;
// when an init and a join both left records, the lock tells which one
// holds the node; and the marker, written last, outranks the records of
// the path that wrote it. A combination that no order of these writes
// produces is an error that says what to do.
package nodestate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
)

// Locker is the node lock, read only.
type Locker interface {
	IsLocked() (bool, error)
	// LockedTo reports whether the node is locked to exactly clusterID.
	LockedTo(clusterID []byte) (bool, error)
}

// Files are where the node keeps its state.
type Files struct {
	// StateDir is bootstrapperd's directory on the state disk, which
	// holds a join's kept ticket (pendingjoin.Path).
	StateDir string
	// InitResult is the init server's result file
	// (initserver.Config.ResultPath); its request record is beside it.
	InitResult string
	// Bootstrapped marks a node that belongs to a cluster. The socket
	// unit's condition reads it too: port 9000 stays closed once it
	// exists.
	Bootstrapped string
}

// State is where the node stands as the daemon starts.
type State struct {
	// Locked means the node lock was taken since boot.
	Locked bool
	// InitInterrupted means an init recorded its request, the node is
	// locked to exactly that init's cluster, and the init saved no
	// result: an earlier run of the daemon stopped in it after its point
	// of no return.
	InitInterrupted bool
	// PendingJoin means a join kept its ticket: it may have taken the
	// lock, and kubeadm join has not finished.
	PendingJoin bool
	// Bootstrapped means the bootstrapped marker exists.
	Bootstrapped bool
}

// Load reads the node's state: the lock through lock, the rest from f.
func Load(lock Locker, f Files) (State, error) {
	var s State
	var err error
	if s.Locked, err = lock.IsLocked(); err != nil {
		return State{}, fmt.Errorf("read the node lock: %w", err)
	}
	if s.InitInterrupted, err = initInterrupted(lock, s.Locked, f.InitResult); err != nil {
		return State{}, fmt.Errorf("look for an interrupted init: %w", err)
	}
	if s.PendingJoin, err = exists(pendingjoin.Path(f.StateDir), os.Lstat); err != nil {
		return State{}, fmt.Errorf("look for a join a reboot interrupted: %w", err)
	}
	if s.Bootstrapped, err = exists(f.Bootstrapped, os.Stat); err != nil {
		return State{}, fmt.Errorf("read the bootstrapped marker: %w", err)
	}
	return s, nil
}

// initInterrupted reports whether the init recorded beside resultPath
// holds the node lock. Only a locked node can hold an init past its point
// of no return; on an unlocked one, a record is one the next request
// replaces.
func initInterrupted(lock Locker, locked bool, resultPath string) (bool, error) {
	if !locked {
		return false, nil
	}
	id := initserver.Unfinished(initserver.Config{ResultPath: resultPath})
	if id == nil {
		return false, nil
	}
	mine, err := lock.LockedTo(id)
	if err != nil {
		return false, fmt.Errorf("read the node lock: %w", err)
	}
	return mine, nil
}

// exists reports whether stat finds path; an error other than its
// absence (an I/O error on the state disk) must not pass for absence,
// which would send a bootstrapped node back to waiting for an init.
func exists(path string, stat func(string) (fs.FileInfo, error)) (bool, error) {
	_, err := stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Step is what the daemon does with a node.
type Step int

const (
	// Wait serves the init service and runs the join client: the node
	// belongs to no cluster yet.
	Wait Step = iota
	// ResumeInit serves the init service alone, for the owner of the
	// interrupted init: only a retry of that init can make something of
	// the locked node.
	ResumeInit
	// FinishJoin runs kubeadm join again with the kept ticket: the node
	// is locked to the ticket's cluster and no join service gives it
	// another.
	FinishJoin
	// Rejoined reports the cluster and leaves: the node belongs to it.
	Rejoined
)

func (s Step) String() string {
	switch s {
	case Wait:
		return "wait for init or join"
	case ResumeInit:
		return "resume the interrupted init"
	case FinishJoin:
		return "finish the interrupted join"
	case Rejoined:
		return "report the rejoined cluster"
	}
	return fmt.Sprintf("Step(%d)", int(s))
}

// ErrMarkedUnlocked means the node is marked bootstrapped but not locked.
var ErrMarkedUnlocked = errors.New("this node is marked as part of a cluster, but its node lock (PCR 15) is not taken: " +
	"the initrd locks such a node to its cluster on every boot before the OS starts, so the node would attest as one of no cluster. " +
	"Reboot it; if it comes back the same, replace it: remove it from the cluster (a worker with 'orrery node remove NAME --yes') and create a new one")

// Next says what the daemon does with a node in state s.
func (s State) Next() (Step, error) {
	switch {
	case !s.Locked && s.Bootstrapped:
		return 0, ErrMarkedUnlocked
	case !s.Locked:
		// Records without the lock are of an init or a join that
		// stopped before its point of no return.
		return Wait, nil
	case s.Bootstrapped:
		// The marker is written last: the path that left a record
		// finished.
		return Rejoined, nil
	case s.InitInterrupted:
		// The lock is the init's, so a kept ticket beside it is of a
		// join that lost the race and stopped before removing it.
		return ResumeInit, nil
	case s.PendingJoin:
		return FinishJoin, nil
	default:
		// Locked with nothing pending: the initrd rejoined the node, or
		// a daemon stopped between an init's or join's end and the
		// marker.
		return Rejoined, nil
	}
}

// MarkBootstrapped records that the node belongs to a cluster, by init
// or by join. It is the last write of bootstrapping: Next trusts it over
// the records written before it, so it must be durable before the daemon
// reports the node bootstrapped.
func (f Files) MarkBootstrapped() error {
	if err := atomicfile.WriteFile(f.Bootstrapped, nil, 0o644); err != nil {
		return fmt.Errorf("mark the node bootstrapped: %w", err)
	}
	return nil
}
