// Package workspace keeps the files an owner holds about a cluster, in one
// directory on the owner's machine: the master secret, the state that a
// retried or later command needs (the measurement salt, the cluster ID),
// the admin kubeconfig, and what a failed init leaves for reading. Init
// writes them; verify, recover and upgrade read them.
package workspace

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/keys"
)

// Names of the files in a workspace.
const (
	MasterSecretFile = "orrery-master-secret.json" //nolint:gosec // a file name, not a secret
	StateFile        = "orrery-state.json"
	KubeconfigFile   = "orrery-admin.conf"
	JournalFile      = "orrery-init-failure.log"
	KubeadmLogFile   = "orrery-init-kubeadm.log"
	// UpgradeLogFile keeps the output of the last 'orrery upgrade apply',
	// for a support bundle.
	UpgradeLogFile = "orrery-upgrade.log"
)

// State is what the owner keeps about a cluster besides its secrets.
type State struct {
	Node            string `json:"node"`
	ClusterName     string `json:"clusterName"`
	MeasurementSalt []byte `json:"measurementSalt"`
	ClusterID       []byte `json:"clusterID,omitempty"`
	// FirstNode is the node the cluster was initialised on, for an init
	// run again to record it as admitted.
	FirstNode *FirstNode `json:"firstNode,omitempty"`
	// ControlPlanes are the instance IDs the owner approved as control
	// planes besides the first node ('orrery control-plane approve' with
	// this workspace): 'orrery recover' gives the master secret to those
	// and the first node alone.
	ControlPlanes []string `json:"controlPlanes,omitempty"`
}

// RecordControlPlane adds (approved) or removes instance id from the
// workspace's control planes. A workspace without a state file records
// nothing and says so.
func (d Dir) RecordControlPlane(id string, approved bool) error {
	st, err := d.ReadState()
	if err != nil {
		return err
	}
	has := slices.Contains(st.ControlPlanes, id)
	switch {
	case approved && !has:
		st.ControlPlanes = append(st.ControlPlanes, id)
	case !approved && has:
		st.ControlPlanes = slices.DeleteFunc(st.ControlPlanes, func(x string) bool { return x == id })
	default:
		return nil
	}
	return d.WriteState(st)
}

// RecordRemoved records that the owner removed node name, certified as
// instanceIDs: recover gives it nothing and no longer counts it among the
// control planes. A workspace without a state file records nothing and
// says so.
func (d Dir) RecordRemoved(name string, instanceIDs []string) error {
	st, err := d.ReadState()
	if err != nil {
		return err
	}
	changed := false
	if f := st.FirstNode; f != nil && !f.Removed && (f.Name == name || slices.Contains(instanceIDs, f.InstanceID)) {
		f.Removed, changed = true, true
	}
	if kept := slices.DeleteFunc(slices.Clone(st.ControlPlanes), func(id string) bool { return slices.Contains(instanceIDs, id) }); len(kept) != len(st.ControlPlanes) {
		st.ControlPlanes, changed = kept, true
	}
	if !changed {
		return nil
	}
	return d.WriteState(st)
}

// ControlPlaneCount is how many control planes the workspace records:
// the first node unless it was removed, and those approved since. One
// approved that never joined is counted too: the workspace cannot tell.
func (st State) ControlPlaneCount() int {
	n := len(st.ControlPlanes)
	if st.FirstNode != nil && !st.FirstNode.Removed {
		n++
	}
	return n
}

// FirstNode is the initialised node as its attestation named it.
type FirstNode struct {
	Name       string `json:"name"`
	InstanceID string `json:"instanceID"`
	DiskUUID   string `json:"diskUUID"`
	// Removed: the owner removed it ('orrery node remove').
	Removed bool `json:"removed,omitempty"`
}

// Dir is a workspace directory.
type Dir string

// Path is the path of the workspace file name.
func (d Dir) Path(name string) string { return filepath.Join(string(d), name) }

// Create makes the directory, readable by its owner only.
func (d Dir) Create() error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return fmt.Errorf("create the owner's directory: %w", err)
	}
	return nil
}

// ReadState reads the state file. A file that does not parse, or lacks
// the measurement salt, is an error that says to restore it: without the
// salt no node's cluster ID can be computed again.
func (d Dir) ReadState() (State, error) {
	path := d.Path(StateFile)
	var st State
	raw, err := d.ReadFile(StateFile)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(raw, &st); err != nil || len(st.MeasurementSalt) != keys.SaltSize {
		return st, fmt.Errorf("%s is damaged: restore it from a backup (it holds the cluster's measurement salt)", path)
	}
	return st, nil
}

// WriteState replaces the state file in one step: a crash leaves the old
// file or the new one, never a part.
func (d Dir) WriteState(st State) error {
	raw, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return d.replace(StateFile, append(raw, '\n'))
}

// WriteKubeconfig stores the cluster's admin kubeconfig and returns its
// path.
func (d Dir) WriteKubeconfig(kubeconfig []byte) (string, error) {
	if err := d.replace(KubeconfigFile, kubeconfig); err != nil {
		return "", err
	}
	return d.Path(KubeconfigFile), nil
}

// Save stores data (a log kept for the owner to read) as name and returns
// its path.
func (d Dir) Save(name string, data []byte) (string, error) {
	path := d.Path(name)
	if err := d.replace(name, data); err != nil {
		return "", fmt.Errorf("save %s: %w", path, err)
	}
	return path, nil
}

// replace writes name whole through a new temporary file (never opened
// through a link) renamed over it: a symbolic link planted under a
// workspace name is replaced, and the file it points to (the master
// secret, say) is not written.
func (d Dir) replace(name string, data []byte) error {
	path := d.Path(name)
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// CreateLog makes the workspace file name anew for a log written as it
// goes, and returns it open. The old file's name is removed first: opened
// as it was, a link planted under that name (to the master secret, say)
// would have its target truncated and overwritten.
func (d Dir) CreateLog(name string) (*os.File, error) {
	path := d.Path(name)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("replace %s: %w", path, err)
	}
	return os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
}

// ErrNotRegular is wrapped by the refusal of a workspace file that is a
// symbolic link or anything else but a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ReadFile reads the workspace file name, which must be a regular file:
// a workspace is often a checkout or a shared directory, and a link
// planted there under a workspace name would make the owner's command
// read (and copy into a support bundle, say) whatever it points to.
func (d Dir) ReadFile(name string) ([]byte, error) {
	path := d.Path(name)
	if err := d.CheckRegular(name); err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

// CheckRegular checks that the workspace file name is a regular file
// (not following a link to tell); a missing file is fs.ErrNotExist.
func (d Dir) CheckRegular(name string) error {
	path := d.Path(name)
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w (%s): the owner's workspace files are plain files that orrery writes; remove it and pass the file you mean with its flag", path, ErrNotRegular, fi.Mode().Type())
	}
	return nil
}
