// Package removednodes is the format of the cluster's list of nodes the
// owner removed ('orrery node remove'): the orrery-removed-nodes ConfigMap
// in kube-system, one key per removed node name, whose value names the VM
// (the instance ID its platform certified) and when it was removed.
//
// Two parts of the cluster read it, so that a removed node stays removed
// whatever it still holds:
//   - the join service, which refuses any ticket to a listed instance or
//     name, even for a disk it never saw (a removed VM with a blank disk);
//   - the API server, through the orrery-removed-nodes admission policy
//     of the orrery-services chart, which refuses every write by the
//     listed nodes' kubelet credentials (system:node:<name>): they cannot
//     re-create their Node, renew their certificate or post pods.
//
// The owner takes a name off the list to let a new VM use it.
package removednodes

import (
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Where the list lives.
const (
	Namespace     = "kube-system"
	ConfigMapName = "orrery-removed-nodes"
)

// ConfigMap is the list's ConfigMap holding l.
//
// A cluster keeps one from init on, even with nobody on it: the API
// server's admission policy looks the list up for every write in the
// cluster. With the ConfigMap there, the lookup is in the API server's
// cache. Without it, the API server asks itself for it on every write,
// with a 1 s deadline (k8s.io/apiserver's policy dispatcher), and fails
// the write when it cannot answer in time: that is how, under TCG with
// three control planes, the controller manager's own lease renewals were
// refused and it stopped signing kubelets' certificates.
func ConfigMap(l List) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: Namespace}, Data: map[string]string{}}
	for name, e := range l {
		cm.Data[name] = e.Value()
	}
	return cm
}

// Entry is one removed node.
type Entry struct {
	// InstanceID is the VM's, as its attestation key certificate names
	// it; empty if the owner removed a node of which the cluster had no
	// record (then only the name is refused).
	InstanceID string `json:"instanceID,omitempty"`
	// RemovedAt is when the owner removed it.
	RemovedAt time.Time `json:"removedAt"`
}

// List is the removed nodes by node name.
type List map[string]Entry

// maxEntry bounds one value: an instance ID and a time.
const maxEntry = 1024

// Parse reads the ConfigMap's data. A key that is not a node name or a
// value that does not parse is an error naming it: the list is the
// owner's, and a list that cannot be read must refuse, not admit.
func Parse(data map[string]string) (List, error) {
	l := List{}
	for name, v := range data {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("%s/%s: key %.64q is not a node name", Namespace, ConfigMapName, name)
		}
		if len(v) > maxEntry {
			return nil, fmt.Errorf("%s/%s: the entry of node %s is %d bytes, more than %d", Namespace, ConfigMapName, name, len(v), maxEntry)
		}
		var e Entry
		if err := json.Unmarshal([]byte(v), &e); err != nil {
			return nil, fmt.Errorf("%s/%s: the entry of node %s: %w", Namespace, ConfigMapName, name, err)
		}
		l[name] = e
	}
	return l, nil
}

// Value is e as the ConfigMap holds it.
func (e Entry) Value() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// Find returns the entry that refuses a node called name or a VM with
// instance ID id, if any, and the name it is listed under.
func (l List) Find(name, id string) (string, Entry, bool) {
	if e, ok := l[name]; ok {
		return name, e, true
	}
	if id == "" {
		return "", Entry{}, false
	}
	for n, e := range l {
		if e.InstanceID == id {
			return n, e, true
		}
	}
	return "", Entry{}, false
}
