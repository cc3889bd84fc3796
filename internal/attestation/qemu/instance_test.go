package qemu_test

import (
	"context"
	"crypto/x509"
	"testing"

	attestpb "github.com/google/go-tpm-tools/proto/attest"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
)

// instanceNode is a node provisioned for inst that measured what
// expected() expects.
func instanceNode(t *testing.T, ca *platformca.CA, inst attestation.Instance) *qemutest.Node {
	n := qemutest.NewInstance(t, ca, inst)
	n.Measure(t, 11, "enter-initrd", "initrd: enter-initrd")
	return n
}

func issueOn(t *testing.T, n *qemutest.Node) []byte {
	t.Helper()
	doc, err := n.Issuer.Issue(context.Background(), userData, nonce)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// The validator names the VM its platform certified, and no other.
func TestValidateProofNamesTheInstance(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: expected(), PlatformCAs: []*x509.Certificate{ca.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]attestation.Instance{
		"named VM":       {Name: "cp-1", ID: "8156203377491"},
		"old VM":         {}, // provisioned before AK certificates named instances
		"dotted name VM": {Name: "worker-3.cluster", ID: "x_1-2.3"},
	}
	for name, inst := range tests {
		t.Run(name, func(t *testing.T) {
			n := instanceNode(t, ca, inst)
			p, err := v.ValidateProof(context.Background(), issueOn(t, n), nonce)
			if err != nil {
				t.Fatalf("ValidateProof: %v", err)
			}
			got, gotInst := p.UserData, p.Instance
			if string(got) != string(userData) || gotInst != inst {
				t.Fatalf("got %q, %v; want %q, %v", got, gotInst, userData, inst)
			}
		})
	}
}

// A validator that checks no certificate names nobody, even when the
// attestation carries a certificate that names someone: it is unverified.
func TestTrustAnyAKNamesNoInstance(t *testing.T) {
	ca, err := platformca.New("some CA nobody trusts")
	if err != nil {
		t.Fatal(err)
	}
	n := instanceNode(t, ca, attestation.Instance{Name: "cp-0", ID: "1"})
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: expected(), TrustAnyAK: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := v.ValidateProof(context.Background(), issueOn(t, n), nonce)
	inst := p.Instance
	if err != nil || !inst.IsZero() {
		t.Fatalf("TrustAnyAK: got %v, %v; want no instance", inst, err)
	}
}

// A certificate from an untrusted CA that names an instance is refused
// before anything is read from it.
func TestInstanceFromForeignCARefused(t *testing.T) {
	trusted, _ := platformca.New("trusted")
	forger, _ := platformca.New("forger")
	n := instanceNode(t, forger, attestation.Instance{Name: "cp-0", ID: "1"})
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: expected(), PlatformCAs: []*x509.Certificate{trusted.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	// Also with the trusted CA's own AK certificate swapped in: it
	// certifies another key.
	other := instanceNode(t, trusted, attestation.Instance{Name: "worker-0", ID: "2"})
	var trustedCert []byte
	mutateAttestation(t, issueOn(t, other), func(a *attestpb.Attestation) { trustedCert = a.AkCert })
	for name, doc := range map[string][]byte{
		"forged certificate":       issueOn(t, n),
		"another VM's certificate": mutateAttestation(t, issueOn(t, n), func(a *attestpb.Attestation) { a.AkCert = trustedCert }),
	} {
		if p, err := v.ValidateProof(context.Background(), doc, nonce); err == nil || !p.Instance.IsZero() {
			t.Errorf("%s: got %v, %v; want a refusal", name, p.Instance, err)
		}
	}
}

// A node reads its own instance from its vTPM, as verifiers see it.
func TestReadInstance(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	for _, inst := range []attestation.Instance{{Name: "cp-0", ID: "77"}, {}} {
		n := qemutest.NewInstance(t, ca, inst)
		rw, err := n.TPM.Open()
		if err != nil {
			t.Fatal(err)
		}
		got, err := qemu.ReadInstance(rw)
		rw.Close()
		if err != nil || got != inst {
			t.Fatalf("ReadInstance = %v, %v; want %v", got, err, inst)
		}
	}
}
