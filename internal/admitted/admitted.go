// Package admitted is the format of the cluster's record of the nodes the
// join service admitted: one ConfigMap per state disk in kube-system, named
// after the disk's UUID, holding the instance (VM) the disk was admitted
// for. The join service writes it when it gives a node its join ticket
// (and refuses a disk already recorded for another VM); a rejoin ticket,
// which hands out the same disk key, goes only to the VM a record names.
// The first control plane records its own disk when it is initialised.
// An owner removes a node from the cluster's memory by deleting its
// record: the node's rejoins are refused from then on.
//
// Disk UUIDs are not secret (anyone who can read the disk's LUKS header
// has it), so a record binds the disk to the VM whose attestation key
// certificate named it, which nobody else can present.
package admitted

import (
	"errors"
	"fmt"
	"strings"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/keys"
)

// Namespace holds the records.
const Namespace = "kube-system"

// Label marks every record, so that 'kubectl get configmap -l' lists them.
const Label = "orrery.dev/admitted-node"

// Keys of a record's data.
const (
	DiskUUIDKey     = "diskUUID"
	InstanceNameKey = "instanceName"
	InstanceIDKey   = "instanceID"
)

// Record says which VM a state disk was admitted for.
type Record struct {
	// DiskUUID is the state disk's LUKS UUID, lower case.
	DiskUUID string
	// Instance is the VM the disk belongs to.
	Instance attestation.Instance
}

// Name is the name of the ConfigMap that records diskUUID, or an error for
// a malformed UUID.
func Name(diskUUID string) (string, error) {
	if _, err := keys.DiskKeyID(diskUUID); err != nil {
		return "", err
	}
	return "orrery-admitted-disk-" + strings.ToLower(diskUUID), nil
}

// ConfigMap is the record as a ConfigMap manifest (JSON-ready).
func (r Record) ConfigMap() (map[string]any, error) {
	name, err := Name(r.DiskUUID)
	if err != nil {
		return nil, err
	}
	if r.Instance.IsZero() {
		return nil, errors.New("admitted node record: no instance")
	}
	return map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{
			"name": name, "namespace": Namespace,
			"labels": map[string]string{Label: "true"},
		},
		"data": map[string]string{
			DiskUUIDKey:     strings.ToLower(r.DiskUUID),
			InstanceNameKey: r.Instance.Name,
			InstanceIDKey:   r.Instance.ID,
		},
	}, nil
}

// Parse reads a record from a ConfigMap's data, checking that it records
// diskUUID: a record under another disk's name is refused.
func Parse(diskUUID string, data map[string]string) (Record, error) {
	r := Record{DiskUUID: data[DiskUUIDKey], Instance: attestation.Instance{Name: data[InstanceNameKey], ID: data[InstanceIDKey]}}
	if !strings.EqualFold(r.DiskUUID, diskUUID) {
		return Record{}, fmt.Errorf("admitted node record for disk %s holds disk %.40q", diskUUID, r.DiskUUID)
	}
	if r.Instance.Name == "" || r.Instance.ID == "" {
		return Record{}, fmt.Errorf("admitted node record for disk %s names no instance", diskUUID)
	}
	return r, nil
}
