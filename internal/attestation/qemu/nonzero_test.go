package qemu_test

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
)

// A verifier that must talk to a node locked to a cluster lists PCR 15 in
// NonZero: an unlocked node is refused, naming the PCR, and a locked one
// passes whatever cluster it is locked to.
func TestNonZeroPCR(t *testing.T) {
	n := newNode(t)
	m := expected()
	delete(m, 15) // the value is unknown to this verifier: any cluster
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: []*x509.Certificate{n.ca.Cert}, NonZero: []uint32{15}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Validate(context.Background(), issue(t, n), nonce)
	var zero *vtpm.ZeroPCRError
	if !errors.As(err, &zero) || zero.PCR != 15 || !strings.Contains(err.Error(), "PCR 15 is zero") {
		t.Fatalf("unlocked node: err = %v, want a *ZeroPCRError for PCR 15", err)
	}
	lock(t, n)
	if _, err := v.Validate(context.Background(), issue(t, n), nonce); err != nil {
		t.Fatalf("locked node refused: %v", err)
	}
}

func TestNonZeroPCROutOfRange(t *testing.T) {
	_, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: expected(), TrustAnyAK: true, NonZero: []uint32{24}})
	if err == nil || !strings.Contains(err.Error(), "PCR 24") {
		t.Fatalf("err = %v, want a refusal naming PCR 24", err)
	}
}
