package gcp

import (
	"crypto/x509"
	"os"
	"testing"
	"time"

	attestpb "github.com/google/go-tpm-tools/proto/attest"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
)

// TestRealGCEAKCertificateChainsToGoogle checks a real GCE vTPM's AK
// certificate against the embedded roots, and reads its instance.
func TestRealGCEAKCertificateChainsToGoogle(t *testing.T) {
	raw, err := os.ReadFile("testdata/gce-cos-85-nonce9009.pb")
	if err != nil {
		t.Fatal(err)
	}
	var att attestpb.Attestation
	if err := proto.Unmarshal(raw, &att); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(att.GetAkCert())
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	verify := func(roots, intermediates []*x509.Certificate) error {
		return vtpm.VerifyAKCert(cert, roots, intermediates, at)
	}
	if err := verify(googleRoots, googleIntermediates); err != nil {
		t.Fatalf("real GCE AK certificate does not chain to Google's roots: %v", err)
	}
	if err := verify(googleRoots, nil); err == nil {
		t.Fatal("the chain check passes without the intermediate CA that issued the certificate: it checks nothing")
	}
	inst, err := GCEInstance(cert)
	if err != nil {
		t.Fatalf("read the GCE instance: %v", err)
	}
	t.Logf("the real certificate names %v", inst)
	if inst.IsZero() {
		t.Fatal("a production GCE AK certificate named no instance")
	}
}
