// Package admitted is the format of the cluster's record of the nodes the
// join service admitted: one AdmittedNode object (internal/records/orreryapi) per
// state disk, named after the disk's UUID, holding the instance (VM) the
// disk was admitted for and the measurement set (image) it last attested
// with. The join service writes it when it gives a node its join ticket
// (and refuses a disk already recorded for another VM); a rejoin ticket,
// which hands out the same disk key, goes only to the VM a record names.
// 'orrery init' records the first control plane's disk. 'orrery node
// remove' marks a node's records removed (RemovedAt), and the API server
// keeps them so for good: the disk's rejoins and joins are refused from
// then on, whatever Node object the old node re-creates. A record also
// holds the disk's generation, which every rejoin advances, so that an
// older copy of the disk is refused (see generation.go), and the
// addresses the node stated when it was admitted, the only ones its
// kubelet gets a serving certificate for (internal/servingcsr).
//
// Disk UUIDs are not secret (anyone who can read the disk's LUKS header
// has it), so a record binds the disk to the VM whose attestation key
// certificate named it, which nobody else can present.
package admitted

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
)

// Record says which VM a state disk was admitted for.
type Record struct {
	// DiskUUID is the state disk's LUKS UUID, lower case.
	DiskUUID string
	// Instance is the VM the disk belongs to.
	Instance attestation.Instance
	// MeasurementSet is the set the node last attested with; empty if not
	// known (the first control plane, recorded by the CLI).
	MeasurementSet string
	// RemovedAt is when the owner removed the disk's node (RFC 3339);
	// empty while the node belongs to the cluster.
	RemovedAt string
	// Generation is the generation the disk held when its node last
	// booted on it (CheckGeneration, RecordGeneration); 0 for a disk
	// that never rejoined since the record holds one (a new record, or
	// one written before generations).
	Generation uint64
	// NextGeneration is the generation the join service last told the
	// disk's node to write, which the node has not recorded yet; 0 if
	// none is pending.
	NextGeneration uint64
	// Addresses are the node's addresses as it stated them when it was
	// admitted (its kubelet's node IP); none for a record written before
	// addresses were, whose kubelet gets no serving certificate.
	Addresses []netip.Addr
}

// MaxAddresses bounds a record's addresses: a node has one per address
// family.
const MaxAddresses = 4

// CheckAddresses checks addresses a node states as its own: at most
// MaxAddresses, no duplicates, each a unicast address another machine
// could reach it at (not unspecified, loopback, multicast or link-local,
// which every machine has alike).
func CheckAddresses(addrs []netip.Addr) error {
	if len(addrs) > MaxAddresses {
		return fmt.Errorf("%d addresses, more than %d", len(addrs), MaxAddresses)
	}
	for i, a := range addrs {
		switch {
		case !a.IsValid():
			return errors.New("an empty address")
		case a.Zone() != "":
			return fmt.Errorf("address %s has a zone", a)
		case a.Is4In6():
			return fmt.Errorf("address %s is an IPv4 address written as IPv6; write it as IPv4", a)
		case a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() || a.IsInterfaceLocalMulticast():
			return fmt.Errorf("address %s is not one another machine reaches this node at", a)
		case slices.Contains(addrs[:i], a):
			return fmt.Errorf("address %s is named twice", a)
		}
	}
	return nil
}

// ParseAddresses reads addresses as a node or a record writes them,
// and checks them (CheckAddresses).
func ParseAddresses(text []string) ([]netip.Addr, error) {
	if len(text) > MaxAddresses {
		return nil, fmt.Errorf("%d addresses, more than %d", len(text), MaxAddresses)
	}
	addrs := make([]netip.Addr, 0, len(text))
	for _, t := range text {
		a, err := netip.ParseAddr(t)
		if err != nil {
			return nil, fmt.Errorf("address %.60q: %w", t, err)
		}
		addrs = append(addrs, a)
	}
	if err := CheckAddresses(addrs); err != nil {
		return nil, err
	}
	return addrs, nil
}

// FormatAddresses writes addresses as records hold them (never nil, so
// that a merge patch of none empties the list).
func FormatAddresses(addrs []netip.Addr) []string {
	out := []string{}
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

// Removed reports whether the owner removed the disk's node.
func (r Record) Removed() bool { return r.RemovedAt != "" }

// KubeletCertLifetime is how long the certificates that the controller
// manager signs for kubelets last: kubeadm's configuration sets it, and
// a removed node's addresses stay its own for as long (HeldUntil).
const KubeletCertLifetime = 168 * time.Hour

// ServingCertLifetime is the longest a kubelet's serving certificate may
// last: the orrery-serving-lifetime admission policy asks it of every
// request to the kubelet-serving signer, and the join service's approver
// denies a request that asks for longer. Kubelets renew from 70-90 % of
// its life on, so 36 min or more remain for a renewal: two of the
// kubelet's 15-minute waits for a request to be decided, enough for a
// control plane that the host restarts (its join service, the approver,
// was back in 1m21s after 'orrery recover' under TCG, and 'orrery init'
// took up to 24 min on a starved host). A serving certificate approved by
// mistake is worth its holder this long at most.
const ServingCertLifetime = 6 * time.Hour

// HeldUntil is until when the node of a removed record may still hold a
// valid kubelet serving certificate for its addresses, which no other
// node may be admitted with before then: the certificate cannot be
// revoked. A removal time that does not parse holds them for good.
func (r Record) HeldUntil() (time.Time, bool) {
	at, err := time.Parse(time.RFC3339, r.RemovedAt)
	if err != nil {
		return time.Time{}, false
	}
	return at.Add(KubeletCertLifetime), true
}

// Name is the name of the object that records diskUUID, or an error for a
// malformed UUID.
func Name(diskUUID string) (string, error) {
	if _, err := keys.DiskKeyID(diskUUID); err != nil {
		return "", err
	}
	return "disk-" + strings.ToLower(diskUUID), nil
}

type instanceJSON struct {
	Name string `json:"name"`
	ID   string `json:"id"`
}

type specJSON struct {
	DiskUUID       string       `json:"diskUUID"`
	Instance       instanceJSON `json:"instance"`
	MeasurementSet string       `json:"measurementSet,omitempty"`
	RemovedAt      string       `json:"removedAt,omitempty"`
	// Signed, as the CRD's integers are: a negative number someone
	// wrote is refused by Parse, not wrapped around.
	Generation     int64    `json:"generation,omitempty"`
	NextGeneration int64    `json:"nextGeneration,omitempty"`
	Addresses      []string `json:"addresses,omitempty"`
}

// Object is the record as an AdmittedNode (JSON-ready).
func (r Record) Object() (map[string]any, error) {
	name, err := Name(r.DiskUUID)
	if err != nil {
		return nil, err
	}
	if r.Instance.Name == "" || r.Instance.ID == "" {
		return nil, errors.New("admitted node record: no instance")
	}
	if r.Generation > MaxGeneration || r.NextGeneration > MaxGeneration {
		return nil, fmt.Errorf("admitted node record: generation %d or %d is more than %d", r.Generation, r.NextGeneration, uint64(MaxGeneration))
	}
	if err := CheckAddresses(r.Addresses); err != nil {
		return nil, fmt.Errorf("admitted node record: %w", err)
	}
	return map[string]any{
		"apiVersion": orreryapi.APIVersion, "kind": orreryapi.AdmittedNodeKind,
		"metadata": map[string]any{"name": name},
		"spec": specJSON{
			DiskUUID:       strings.ToLower(r.DiskUUID),
			Instance:       instanceJSON{Name: r.Instance.Name, ID: r.Instance.ID},
			MeasurementSet: r.MeasurementSet,
			RemovedAt:      r.RemovedAt,
			Generation:     int64(r.Generation),
			NextGeneration: int64(r.NextGeneration),
			Addresses:      FormatAddresses(r.Addresses),
		},
	}, nil
}

// maxObject bounds what Parse reads: a record is a few hundred bytes.
const maxObject = 64 << 10

// Parse reads a record from an AdmittedNode object as the API server
// returns it, checking that it records diskUUID: a record under another
// disk's name is refused.
func Parse(diskUUID string, object []byte) (Record, error) {
	if len(object) > maxObject {
		return Record{}, fmt.Errorf("admitted node record for disk %s is %d bytes, more than %d", diskUUID, len(object), maxObject)
	}
	var o struct {
		Kind string   `json:"kind"`
		Spec specJSON `json:"spec"`
	}
	if err := json.Unmarshal(object, &o); err != nil {
		return Record{}, fmt.Errorf("decode the admitted node record for disk %s: %w", diskUUID, err)
	}
	if o.Kind != orreryapi.AdmittedNodeKind {
		return Record{}, fmt.Errorf("admitted node record for disk %s is a %.40q, not an %s", diskUUID, o.Kind, orreryapi.AdmittedNodeKind)
	}
	r := Record{
		DiskUUID:       o.Spec.DiskUUID,
		Instance:       attestation.Instance{Name: o.Spec.Instance.Name, ID: o.Spec.Instance.ID},
		MeasurementSet: o.Spec.MeasurementSet,
		RemovedAt:      o.Spec.RemovedAt,
	}
	if !strings.EqualFold(r.DiskUUID, diskUUID) {
		return Record{}, fmt.Errorf("admitted node record for disk %s holds disk %.40q", diskUUID, r.DiskUUID)
	}
	if r.Instance.Name == "" || r.Instance.ID == "" {
		return Record{}, fmt.Errorf("admitted node record for disk %s names no instance", diskUUID)
	}
	for _, g := range []struct {
		field string
		v     int64
		to    *uint64
	}{{"generation", o.Spec.Generation, &r.Generation}, {"nextGeneration", o.Spec.NextGeneration, &r.NextGeneration}} {
		if g.v < 0 || g.v > MaxGeneration {
			return Record{}, fmt.Errorf("admitted node record for disk %s holds %s %d, not a number from 0 to %d: set it to the generation the disk's node last reported (its console says) or remove the node", diskUUID, g.field, g.v, int64(MaxGeneration))
		}
		*g.to = uint64(g.v)
	}
	addrs, err := ParseAddresses(o.Spec.Addresses)
	if err != nil {
		return Record{}, fmt.Errorf("admitted node record for disk %s: %w", diskUUID, err)
	}
	r.Addresses = addrs
	return r, nil
}

// BadItemsError names the items of a list that did not parse.
type BadItemsError struct{ Errs []error }

func (e *BadItemsError) Error() string { return errors.Join(e.Errs...).Error() }

// ParseList reads an AdmittedNodeList (or one page of it) as the API
// server returns it. Items that do not parse are left out and named in a
// *BadItemsError beside the good ones: one bad record must not hide
// every other node's. Any other error means the list itself is not one.
func ParseList(list []byte) ([]Record, error) {
	var l struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(list, &l); err != nil {
		return nil, fmt.Errorf("decode the list of admitted node records: %w", err)
	}
	var recs []Record
	var bad []error
	for _, item := range l.Items {
		var meta struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		_ = json.Unmarshal(item, &meta)
		disk, ok := strings.CutPrefix(meta.Metadata.Name, "disk-")
		if !ok {
			bad = append(bad, fmt.Errorf("admitted node record %.80q is not named disk-<UUID>", meta.Metadata.Name))
			continue
		}
		r, err := Parse(disk, item)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		recs = append(recs, r)
	}
	if len(bad) > 0 {
		return recs, &BadItemsError{bad}
	}
	return recs, nil
}
