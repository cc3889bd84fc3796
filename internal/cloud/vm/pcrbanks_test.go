package vm

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/swtpm"
	"github.com/orrery-dev/orrery/internal/swtpm/swtpmtest"
)

// TestNewVTPMHasOnlySHA256Bank creates a VM's vTPM as Start does, with and
// without a provisioning step, and restarts it as QEMU's swtpm would: only
// the SHA-256 bank may be left, with all 24 PCRs, and the provisioning
// must still have run.
func TestNewVTPMHasOnlySHA256Bank(t *testing.T) {
	for name, provision := range map[string]bool{"provisioned": true, "not provisioned": false} {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Name: "banks", Dir: t.TempDir()}
			ran := false
			if provision {
				cfg.ProvisionTPM = func(rw io.ReadWriter) error {
					ran = true
					_, err := tpm2.GetRandom(rw, 8)
					return err
				}
			}
			if err := provisionTPM(context.Background(), cfg, func(string) {}); err != nil {
				t.Fatal(err)
			}
			if ran != provision {
				t.Errorf("ProvisionTPM ran: %v, want %v", ran, provision)
			}
			rw := open(t, swtpmtest.StartWithState(t, filepath.Join(cfg.Dir, TPMDir)))
			sels := banks(t, rw)
			if len(sels) != 1 || sels[0].Hash != tpm2.AlgSHA256 || len(sels[0].PCRs) != pcrCount {
				t.Fatalf("banks after a restart: %v, want SHA-256 alone with %d PCRs", sels, pcrCount)
			}
			// Asking again changes nothing and needs no restart.
			if err := keepSHA256BankOnly(rw); err != nil {
				t.Errorf("on a TPM that has SHA-256 alone: %v", err)
			}
		})
	}
}

// TestNewSWTPMHasOtherBanks keeps TestNewVTPMHasOnlySHA256Bank honest:
// swtpm without swtpm_setup starts with more banks than SHA-256.
func TestNewSWTPMHasOtherBanks(t *testing.T) {
	sels := banks(t, open(t, swtpmtest.Start(t)))
	if !slices.ContainsFunc(sels, func(s tpm2.PCRSelection) bool { return s.Hash != tpm2.AlgSHA256 }) {
		t.Fatalf("a new swtpm has only %v: the allocation this package does is not needed any more", sels)
	}
	t.Logf("a new swtpm's banks: %v", sels)
}

// open connects to in until the test ends.
func open(t *testing.T, in *swtpm.Instance) io.ReadWriter {
	t.Helper()
	rw, err := in.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rw.Close() })
	return rw
}

// banks lists the TPM's allocated PCR banks.
func banks(t *testing.T, rw io.ReadWriter) []tpm2.PCRSelection {
	t.Helper()
	sels, err := client.AllocatedPCRs(rw)
	if err != nil {
		t.Fatal(err)
	}
	return sels
}
