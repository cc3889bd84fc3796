// Package workspace keeps the files an owner holds about a cluster, in one
// directory on the owner's machine: the master secret, the state that a
// retried or later command needs (the measurement salt, the cluster ID),
// the admin kubeconfig, and what a failed init leaves for reading. Init
// writes them; verify, recover and upgrade read them.
package workspace

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/orrery-dev/orrery/internal/keys"
)

// Names of the files in a workspace.
const (
	MasterSecretFile = "orrery-master-secret.json"
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
}

// FirstNode is the initialised node as its attestation named it.
type FirstNode struct {
	Name       string `json:"name"`
	InstanceID string `json:"instanceID"`
	DiskUUID   string `json:"diskUUID"`
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
	raw, err := os.ReadFile(path)
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
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("save %s: %w", path, err)
	}
	return path, nil
}

func (d Dir) replace(name string, data []byte) error {
	path := d.Path(name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
