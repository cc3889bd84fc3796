// Package variant names the kinds of attestation Orrery understands. Each
// variant has a short name (used in configuration and logs) and an OID (sent
// on the wire, so a peer cannot confuse one variant's document for another's).
//
// A variant plugs in by adding a Variant here and an issuer/validator pair
// under internal/attestation.
package variant

import (
	"fmt"
	"sort"
	"strings"
)

// Variant identifies an attestation variant.
type Variant struct {
	name string
	oid  string
}

// String is the variant's configuration name, e.g. "qemu-vtpm".
func (v Variant) String() string { return v.name }

// OID is the variant's dotted object identifier.
func (v Variant) OID() string { return v.oid }

// orreryArc is the root of Orrery's OIDs: a UUID-derived OID (ITU-T X.667,
// arc 2.25), which anyone may mint without registration.
const orreryArc = "2.25.214409873021508386470366218546406418201"

// QEMUVTPM is a QEMU VM with an swtpm vTPM whose attestation key is certified
// by the local cloud's platform CA.
var QEMUVTPM = register("qemu-vtpm", orreryArc+".1.1")

// GCPSEVSNP is a Google Cloud Confidential VM on AMD SEV-SNP: a vTPM
// quote with an SEV-SNP report beside it (package gcp). The local cloud
// plays it under a test root.
var GCPSEVSNP = register("gcp-sev-snp", orreryArc+".1.2")

// GCPTDX is a Google Cloud Confidential VM on Intel TDX: a vTPM quote with
// a TD quote beside it (package gcp).
var GCPTDX = register("gcp-tdx", orreryArc+".1.3")

var byName = map[string]Variant{}

func register(name, oid string) Variant {
	v := Variant{name: name, oid: oid}
	for _, o := range byName {
		if o.oid == oid {
			panic("variant: duplicate OID " + oid)
		}
	}
	byName[name] = v
	return v
}

// FromString returns the variant with the given name.
func FromString(name string) (Variant, error) {
	if v, ok := byName[name]; ok {
		return v, nil
	}
	return Variant{}, fmt.Errorf("unknown attestation variant %q (known: %s)", name, strings.Join(Names(), ", "))
}

// FromOID returns the variant with the given OID.
func FromOID(oid string) (Variant, error) {
	for _, v := range byName {
		if v.oid == oid {
			return v, nil
		}
	}
	return Variant{}, fmt.Errorf("unknown attestation variant OID %q", oid)
}

// Names lists the known variants' names, sorted.
func Names() []string {
	var out []string
	for n := range byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
