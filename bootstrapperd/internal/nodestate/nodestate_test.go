package nodestate

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

var (
	initCluster = []byte("0123456789abcdef0123456789abcdef")
	joinCluster = []byte("fedcba9876543210fedcba9876543210")
)

// node is what a test leaves on a node before the daemon starts, in the
// order the init and join paths write it.
type node struct {
	// initRecord records an init's request for initCluster; initResult
	// its result.
	initRecord, initResult bool
	// ticket keeps a join's ticket.
	ticket bool
	// lockTo locks the node to a cluster; nil leaves it unlocked.
	lockTo []byte
	marker bool
}

// files writes n's files into a new directory laid out as on a node.
func (n node) files(t *testing.T) Files {
	t.Helper()
	dir := t.TempDir()
	f := Files{StateDir: dir, InitResult: filepath.Join(dir, "init-result.json"), Bootstrapped: filepath.Join(dir, "bootstrapped")}
	write := func(path string, v any) {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n.initRecord {
		write(filepath.Join(dir, "init-request.json"), map[string]any{"clusterID": initCluster, "clusterName": "demo"})
	}
	if n.initResult {
		write(f.InitResult, map[string]any{"clusterID": initCluster, "kubeconfig": []byte("kubeconfig")})
	}
	if n.ticket {
		if err := pendingjoin.Save(dir, &joinpb.IssueJoinTicketResponse{ApiServerEndpoint: "10.42.1.100:6443"}, []byte("key")); err != nil {
			t.Fatal(err)
		}
	}
	if n.marker {
		if err := f.MarkBootstrapped(); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// loadTests are what the init and join paths leave when the daemon stops
// between any two of their writes, and what no order of them leaves.
var loadTests = map[string]struct {
	node    node
	want    State
	step    Step
	wantErr error
}{
	"fresh node": {step: Wait},
	// A record before the lock is replaced by the next attempt.
	"init stopped before the lock": {node: node{initRecord: true}, step: Wait},
	"join stopped before the lock": {node: node{ticket: true}, want: State{PendingJoin: true}, step: Wait},
	"init interrupted after the lock": {
		node: node{initRecord: true, lockTo: initCluster},
		want: State{Locked: true, InitInterrupted: true}, step: ResumeInit,
	},
	"init finished and daemon stopped before the marker": {
		node: node{initRecord: true, initResult: true, lockTo: initCluster},
		want: State{Locked: true}, step: Rejoined,
	},
	"join interrupted after the lock": {
		node: node{ticket: true, lockTo: joinCluster},
		want: State{Locked: true, PendingJoin: true}, step: FinishJoin,
	},
	// The join took the lock; the init that lost the race left its
	// record.
	"join took the lock from a recorded init": {
		node: node{initRecord: true, ticket: true, lockTo: joinCluster},
		want: State{Locked: true, PendingJoin: true}, step: FinishJoin,
	},
	// The init took the lock; the join that lost the race stopped
	// before removing its ticket.
	"init took the lock from a join with a ticket": {
		node: node{initRecord: true, ticket: true, lockTo: initCluster},
		want: State{Locked: true, InitInterrupted: true, PendingJoin: true}, step: ResumeInit,
	},
	"joined and daemon stopped before the marker": {node: node{lockTo: joinCluster}, want: State{Locked: true}, step: Rejoined},
	"bootstrapped by init and rejoined by the initrd": {
		node: node{initRecord: true, initResult: true, lockTo: initCluster, marker: true},
		want: State{Locked: true, Bootstrapped: true}, step: Rejoined,
	},
	"bootstrapped by join and rejoined by the initrd": {
		node: node{lockTo: joinCluster, marker: true},
		want: State{Locked: true, Bootstrapped: true}, step: Rejoined,
	},
	// The marker is written last: what the path left before it
	// does not reopen bootstrapping.
	"bootstrapped with the init's result lost": {
		node: node{initRecord: true, lockTo: initCluster, marker: true},
		want: State{Locked: true, InitInterrupted: true, Bootstrapped: true}, step: Rejoined,
	},
	"bootstrapped with the join's ticket left": {
		node: node{ticket: true, lockTo: joinCluster, marker: true},
		want: State{Locked: true, PendingJoin: true, Bootstrapped: true}, step: Rejoined,
	},
	// No order of the daemon's writes gives these.
	"marked bootstrapped but not locked": {
		node: node{marker: true},
		want: State{Bootstrapped: true}, wantErr: ErrMarkedUnlocked,
	},
	"marked bootstrapped with a ticket but not locked": {
		node: node{ticket: true, marker: true},
		want: State{PendingJoin: true, Bootstrapped: true}, wantErr: ErrMarkedUnlocked,
	},
}

// Load and Next decide every combination in loadTests as the daemon
// must, against the real node lock.
func TestLoad(t *testing.T) {
	for name, tc := range loadTests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			lock := nodelock.New(swtpmtest.Start(t).Open, &pcrlog.Log{Path: filepath.Join(dir, "measurements.log")})
			if tc.node.lockTo != nil {
				if ok, err := lock.TryLock(tc.node.lockTo); err != nil || !ok {
					t.Fatalf("TryLock = %v, %v", ok, err)
				}
			}
			got, err := Load(lock, tc.node.files(t))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Load = %+v, want %+v", got, tc.want)
			}
			step, err := got.Next()
			if !errors.Is(err, tc.wantErr) || err == nil && step != tc.step {
				t.Fatalf("Next = %v, %v; want %v, %v", step, err, tc.step, tc.wantErr)
			}
		})
	}
}

// Every combination gets a step or an error that says what to do.
func TestNextDecidesEveryCombination(t *testing.T) {
	for i := range 16 {
		s := State{Locked: i&1 != 0, InitInterrupted: i&2 != 0, PendingJoin: i&4 != 0, Bootstrapped: i&8 != 0}
		step, err := s.Next()
		switch {
		case err != nil && !strings.Contains(err.Error(), "Reboot"):
			t.Errorf("%+v: error %q does not say what to do", s, err)
		case err == nil && (step < Wait || step > Rejoined):
			t.Errorf("%+v: step %v is none of the daemon's", s, step)
		case err == nil && !s.Locked && step != Wait:
			t.Errorf("%+v: an unlocked node gets step %v; want %v", s, step, Wait)
		}
	}
}

// lockFunc is the lock of a locked node, whose reads fail as tests say.
type lockFunc struct {
	locked, lockedTo error
}

func (l lockFunc) IsLocked() (bool, error)       { return l.locked == nil, l.locked }
func (l lockFunc) LockedTo([]byte) (bool, error) { return false, l.lockedTo }

// A state that cannot be read is an error, never taken for a fresh node:
// that would serve init on a node that belongs to a cluster.
func TestLoadErrors(t *testing.T) {
	notADir := func(t *testing.T) string {
		path := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tpmGone := errors.New("open TPM: no such device")
	tests := map[string]struct {
		lock    Locker
		files   func(*testing.T, Files) Files
		wantErr string
	}{
		"lock unreadable": {lock: lockFunc{locked: tpmGone}, wantErr: "read the node lock: open TPM"},
		"lock unreadable for the init's cluster": {
			lock: lockFunc{lockedTo: tpmGone},
			files: func(t *testing.T, _ Files) Files {
				return node{initRecord: true}.files(t)
			},
			wantErr: "look for an interrupted init: read the node lock",
		},
		"state directory unreadable": {
			lock: lockFunc{},
			files: func(t *testing.T, f Files) Files {
				f.StateDir = filepath.Join(notADir(t), "state")
				return f
			},
			wantErr: "look for a join a reboot interrupted",
		},
		"marker unreadable": {
			lock: lockFunc{},
			files: func(t *testing.T, f Files) Files {
				f.Bootstrapped = filepath.Join(notADir(t), "bootstrapped")
				return f
			},
			wantErr: "read the bootstrapped marker",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := node{}.files(t)
			if tc.files != nil {
				f = tc.files(t, f)
			}
			if _, err := Load(tc.lock, f); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Load = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

func TestMarkBootstrapped(t *testing.T) {
	dir := t.TempDir()
	f := Files{StateDir: dir, InitResult: filepath.Join(dir, "init-result.json"), Bootstrapped: filepath.Join(dir, "lib", "bootstrapped")}
	if err := f.MarkBootstrapped(); err != nil {
		t.Fatal(err)
	}
	if err := f.MarkBootstrapped(); err != nil {
		t.Fatalf("marking a marked node: %v", err)
	}
	s, err := Load(lockFunc{}, f)
	if err != nil || !s.Bootstrapped {
		t.Fatalf("Load after MarkBootstrapped = %+v, %v", s, err)
	}
	entries, err := os.ReadDir(filepath.Dir(f.Bootstrapped))
	if err != nil || len(entries) != 1 {
		t.Fatalf("the marker's directory holds %v (%v); want the marker alone", entries, err)
	}
	// A file where the marker's directory should be: the daemon is told.
	f.Bootstrapped = filepath.Join(f.Bootstrapped, "bootstrapped")
	if err := f.MarkBootstrapped(); err == nil || !strings.Contains(err.Error(), "mark the node bootstrapped") {
		t.Fatalf("MarkBootstrapped under a file = %v, want an error", err)
	}
}
