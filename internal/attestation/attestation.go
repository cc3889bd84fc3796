// Package attestation defines what every attestation variant provides: an
// issuer that proves what a machine runs, and a validator that checks such a
// proof without needing any TPM or TEE itself.
//
// A proof (an attestation document) always binds two values chosen outside
// the variant: the verifier's fresh nonce, which makes a captured document
// useless later, and the attester's user data (in attested TLS, its TLS public
// key), which makes a document useless to anyone without that key.
package attestation

import (
	"context"
	"crypto/sha256"
	"encoding/binary"

	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// Issuer produces attestation documents on the machine being attested.
type Issuer interface {
	Variant() variant.Variant
	// Issue returns a document that binds userData and nonce to the
	// machine's measured state.
	Issue(ctx context.Context, userData, nonce []byte) ([]byte, error)
}

// Validator checks attestation documents of one variant.
type Validator interface {
	Variant() variant.Variant
	// Validate checks that doc was produced by a trusted platform in the
	// expected state for nonce, and returns the user data it binds. The
	// caller must compare that user data with what it expects.
	Validate(ctx context.Context, doc, nonce []byte) (userData []byte, err error)
}

// Instance is the identity a platform certified for an attesting machine:
// the cloud's name and ID of the VM, as the certificate of its attestation
// key states them (GCE's AK certificates carry them; so do the local
// cloud's, see package platformca). It is what a verifier may use to tell
// one machine from another. The zero value names no machine.
type Instance struct {
	// Name is the VM's name, which is also its Kubernetes node name.
	Name string
	// ID is unique per VM the platform created: a VM created again under
	// an old name gets a new ID.
	ID string
}

// IsZero reports whether i names no machine.
func (i Instance) IsZero() bool { return i == Instance{} }

// String is "name (instance ID id)", for logs and errors.
func (i Instance) String() string {
	if i.IsZero() {
		return "no instance"
	}
	return i.Name + " (instance ID " + i.ID + ")"
}

// Field is one field of a hardware report (an SEV-SNP report, a TD
// quote), named and formatted for the owner to read.
type Field struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Proof is what a validator established about an attesting machine.
type Proof struct {
	// UserData is the data the document binds; the caller must compare
	// it with what it expects.
	UserData []byte
	// Instance is the machine the platform's certificate of the key that
	// signed the document names: only from a certificate that chains to
	// the validator's trusted roots, never from what the machine says of
	// itself. The zero Instance means the certificate names none (or no
	// certificate was checked, as with a development validator that
	// trusts any key).
	Instance Instance
	// Hardware lists the verified hardware report's fields, for
	// variants rooted in a CPU vendor's keys; nil for others.
	Hardware []Field
}

// ProofValidator is a Validator that also tells which machine attested
// and what its hardware reported. A caller that needs the identity (the
// join service naming a node) asks through this interface, and must
// treat a validator that does not implement it as one that identifies
// nobody.
type ProofValidator interface {
	Validator
	// ValidateProof does what Validate does, and returns the Proof.
	ValidateProof(ctx context.Context, doc, nonce []byte) (Proof, error)
}

// bindingDomain separates our binding digests from any other use of a quote's
// qualifying data.
const bindingDomain = "orrery attestation binding v1"

// BindingDigest is the 32-byte value an attestation commits to: a hash over
// the nonce and the user data, each length-prefixed so that no two different
// pairs give the same input.
func BindingDigest(nonce, userData []byte) []byte {
	h := sha256.New()
	h.Write([]byte(bindingDomain))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(nonce)))
	h.Write(n[:])
	h.Write(nonce)
	binary.BigEndian.PutUint64(n[:], uint64(len(userData)))
	h.Write(n[:])
	h.Write(userData)
	return h.Sum(nil)
}

// ValidateProof validates doc with v, through ValidateProof if v is a
// ProofValidator; otherwise the Proof holds only the user data.
func ValidateProof(ctx context.Context, v Validator, doc, nonce []byte) (Proof, error) {
	if pv, ok := v.(ProofValidator); ok {
		return pv.ValidateProof(ctx, doc, nonce)
	}
	userData, err := v.Validate(ctx, doc, nonce)
	if err != nil {
		return Proof{}, err
	}
	return Proof{UserData: userData}, nil
}
