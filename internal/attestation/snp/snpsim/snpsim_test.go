package snpsim

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	test "github.com/google/go-sev-guest/testing"

	"github.com/orrery-dev/orrery/internal/attestation/snp"
)

// A saved chip, loaded again, signs reports that its saved root's policy
// accepts: the local cloud keeps one root across runs.
func TestSaveLoadKeepsTheRoot(t *testing.T) {
	now := time.Now()
	chip, err := NewChip(Config{Keys: test.DefaultAmdKeys(), Now: now.Add(-time.Hour), TCB: kds.TCBParts{BlSpl: 4, SnpSpl: 22, UcodeSpl: 213}, ChipID: [64]byte{7}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := chip.Save(dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, File)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("saved chip: %v, mode %v; want 0600 (it holds private keys)", err, st.Mode())
	}
	rootFile := filepath.Join(dir, "root.json")
	if err := chip.WriteTestRoot(rootFile, now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err := snp.ParsePolicy([]byte(`{"measurement":{"expected":"` + hex48 + `"},"testRoot":` + string(raw) + `}`))
	if err != nil {
		t.Fatal(err)
	}
	var data [64]byte
	data[0] = 9
	att, err := loaded.Report(Guest{Policy: abi.SnpPolicy{SMT: true}}, data)
	if err != nil {
		t.Fatal(err)
	}
	v, err := snp.NewVerifier(snp.Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.VerifyReport(context.Background(), att, data[:]); err != nil {
		t.Fatalf("a report of the loaded chip refused under the saved root: %v", err)
	}
}

const hex48 = "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"

// The test root's CRL, which the local cloud hands the owner and which a
// cluster's measurement sets keep, stays valid as long as the ARK: a
// verifier refuses a CRL past its nextUpdate, and a long-running local
// cloud has no way to replace the sets' copy.
func TestTestRootCRLLastsAsLongAsTheARK(t *testing.T) {
	now := time.Date(2026, time.November, 1, 0, 0, 0, 0, time.UTC)
	chip, err := NewChip(Config{Keys: test.DefaultAmdKeys(), Now: now.Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	root, err := chip.TestRootWithCRL(now)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(root.CRL))
	if block == nil {
		t.Fatal("the test root has no PEM CRL")
	}
	crl, err := x509.ParseRevocationList(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !crl.ThisUpdate.Equal(now) || !crl.NextUpdate.Equal(chip.signer.Ark.NotAfter) {
		t.Fatalf("the test root's CRL is valid from %s to %s, want from %s until the ARK expires (%s)", crl.ThisUpdate, crl.NextUpdate, now, chip.signer.Ark.NotAfter)
	}
	if crl.NextUpdate.Before(now.AddDate(20, 0, 0)) {
		t.Fatalf("the test root's CRL expires on %s, within 20 years", crl.NextUpdate)
	}
}
