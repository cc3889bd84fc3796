package vm

import (
	"fmt"
	"io"
	"slices"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
)

// pcrCount is the number of PCRs of a PC Client TPM.
const pcrCount = 24

// keepSHA256BankOnly makes SHA-256 the vTPM's only PCR bank, from its next
// start on (TPM2_PCR_Allocate takes effect at the next power-on).
//
// A new swtpm allocates four banks (SHA-1, SHA-256, SHA-384, SHA-512), and
// the firmware, systemd-stub and the kernel hash everything they measure
// once for each bank: the UKI for PCR 4, its sections for PCR 11, the
// initrd for PCR 9. Orrery predicts, quotes and verifies SHA-256 only, so
// the other three banks bought nothing but time: under TCG, where the
// firmware's hashing runs emulated, that was several seconds of every
// boot. swtpm_setup allocates SHA-256 alone by default for the same
// reason; the local cloud creates its vTPMs without swtpm_setup.
func keepSHA256BankOnly(rw io.ReadWriter) error {
	sels, err := client.AllocatedPCRs(rw)
	if err != nil {
		return fmt.Errorf("read the vTPM's PCR banks: %w", err)
	}
	all := make([]int, pcrCount)
	for i := range all {
		all[i] = i
	}
	want := []tpm2.PCRSelection{{Hash: tpm2.AlgSHA256, PCRs: all}}
	for _, s := range sels {
		if s.Hash != tpm2.AlgSHA256 {
			// An empty selection releases the bank.
			want = append(want, tpm2.PCRSelection{Hash: s.Hash, PCRs: []int{}})
		}
	}
	if len(sels) == 1 && sels[0].Hash == tpm2.AlgSHA256 && slices.Equal(sels[0].PCRs, all) {
		return nil
	}
	// The platform hierarchy's authorization is empty on a new TPM; the
	// firmware would set one, and it has not run yet.
	auth := tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession}
	if err := tpm2.PCRAllocate(rw, tpm2.HandlePlatform, auth, want); err != nil {
		return fmt.Errorf("allocate the vTPM's SHA-256 PCR bank only: %w", err)
	}
	return nil
}
