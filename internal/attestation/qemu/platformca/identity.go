package platformca

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"strconv"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/nodename"
)

// The local cloud names the VM an attestation key belongs to in the AK
// certificate, as GCE does in its AK certificates. A verifier that accepts
// the certificate (it chains to the platform CA) can then tell which VM
// attested, and nothing the VM sends can change that: the join service
// takes a node's name from here, never from the node's request.
//
// Encoding: the certificate's subject holds exactly one common name (OID
// 2.5.4.3), the instance name, and exactly one serialNumber attribute
// (OID 2.5.4.5, X.520's attribute for "an identifier of the device"), the
// instance ID, both UTF8String or PrintableString. Nothing else in the
// subject is read. GCE uses an extension of its own instead; Orrery's OID
// arc (2.25.<UUID>, see package variant) has an arc too large for Go's
// encoding/asn1, which cannot parse a certificate extension under it, and
// standard subject attributes show in any tool (openssl x509 -subject).
// A certificate the local cloud issued before it named instances has no
// serialNumber (its common name is a description with spaces): ErrNoInstance.
//
// The ID tells two VMs of the same name apart: a VM that is deleted and
// created again under its old name gets a new ID, as on GCE. It is what an
// owner approves, not the name (see joinservice's control-plane list).

var (
	oidCommonName   = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidSerialNumber = asn1.ObjectIdentifier{2, 5, 4, 5}
)

// maxInstanceIDLen bounds an instance ID; GCE's are 19 decimal digits.
const maxInstanceIDLen = 64

// NewInstance names a VM the local cloud is about to provision: name is
// its (and its Kubernetes node's) name, and the ID is fresh, a random
// non-zero 63-bit number in decimal like GCE's instance IDs.
func NewInstance(name string) attestation.Instance {
	n, err := rand.Int(rand.Reader, new(big.Int).SetUint64(1<<63-1))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux.
	}
	return attestation.Instance{Name: name, ID: strconv.FormatUint(n.Uint64()+1, 10)}
}

// CheckInstance returns an error unless inst has a name Kubernetes accepts
// as a node name (a lowercase DNS subdomain) and an ID of 1 to 64 ASCII
// letters, digits, '-', '.' or '_': both end up in logs, ConfigMaps and
// certificate subjects, and the platform writes nothing else.
func CheckInstance(inst attestation.Instance) error {
	if !nodename.Valid(inst.Name) {
		return fmt.Errorf("instance name %.80q is not a valid node name (a lowercase DNS subdomain of at most 253 bytes)", inst.Name)
	}
	return CheckInstanceID(inst.ID)
}

// CheckInstanceID returns an error unless id is 1 to 64 ASCII letters,
// digits, '-', '.' or '_'.
func CheckInstanceID(id string) error {
	if len(id) == 0 || len(id) > maxInstanceIDLen {
		return fmt.Errorf("instance ID has %d bytes, want 1 to %d", len(id), maxInstanceIDLen)
	}
	for _, r := range id {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '.' || r == '_') {
			return fmt.Errorf("instance ID %.80q has a character other than ASCII letters, digits, '-', '.' and '_'", id)
		}
	}
	return nil
}

// instanceSubject is the AK certificate's subject for inst.
func instanceSubject(inst attestation.Instance) (pkix.Name, error) {
	if err := CheckInstance(inst); err != nil {
		return pkix.Name{}, err
	}
	return pkix.Name{CommonName: inst.Name, SerialNumber: inst.ID}, nil
}

// ErrNoInstance is returned by InstanceOf for an AK certificate that names
// no instance: one the local cloud issued before it certified instances.
var ErrNoInstance = errors.New("the attestation key certificate names no instance: the VM was provisioned by a local cloud older than instance identities; recreate the VM ('orrery mini down', then 'orrery mini up') so that its vTPM is provisioned again")

// InstanceOf returns the instance an AK certificate names. It trusts the
// certificate: the caller must have checked that it chains to the
// platform CA. A certificate without an instance ID gives ErrNoInstance;
// one whose subject is malformed, repeats an attribute or names an
// invalid instance, an error of its own.
func InstanceOf(cert *x509.Certificate) (attestation.Instance, error) {
	return ParseInstanceSubject(cert.RawSubject)
}

// ParseInstanceSubject reads the instance from the DER of a certificate's
// subject (an RDNSequence), as InstanceOf does.
func ParseInstanceSubject(der []byte) (attestation.Instance, error) {
	var rdns pkix.RDNSequence
	rest, err := asn1.Unmarshal(der, &rdns)
	if err != nil {
		return attestation.Instance{}, fmt.Errorf("decode the attestation key certificate's subject: %w", err)
	}
	if len(rest) > 0 {
		return attestation.Instance{}, errors.New("decode the attestation key certificate's subject: trailing data")
	}
	var names, ids []string
	for _, rdn := range rdns {
		for _, atv := range rdn {
			var dst *[]string
			switch {
			case atv.Type.Equal(oidCommonName):
				dst = &names
			case atv.Type.Equal(oidSerialNumber):
				dst = &ids
			default:
				continue
			}
			v, ok := atv.Value.(string)
			if !ok {
				return attestation.Instance{}, fmt.Errorf("the attestation key certificate's subject has a %v attribute that is not a string", atv.Type)
			}
			*dst = append(*dst, v)
		}
	}
	switch {
	case len(ids) == 0:
		return attestation.Instance{}, ErrNoInstance
	case len(ids) > 1 || len(names) != 1:
		return attestation.Instance{}, fmt.Errorf("the attestation key certificate's subject has %d common names and %d serial numbers, want one of each", len(names), len(ids))
	}
	inst := attestation.Instance{Name: names[0], ID: ids[0]}
	if err := CheckInstance(inst); err != nil {
		return attestation.Instance{}, fmt.Errorf("the attestation key certificate's instance: %w", err)
	}
	return inst, nil
}
