package tdx

import (
	"bytes"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// Measurements are a TD's measurement registers, as its own TD report or
// a quote's TD report body shows them.
type Measurements struct {
	// MRTD is the TD's build-time measurement (48 bytes).
	MRTD []byte
	// RTMR are RTMR0 to RTMR3 (48 bytes each).
	RTMR [4][]byte
}

// PeerRTMRs are the RTMRs a TD holds a peer of its own image to (see
// PeerPolicy). Under TDVF (and the EFI_CC_MEASUREMENT_PROTOCOL mapping of
// TPM PCRs to TDX measurement registers) they hold:
//
//   - RTMR0 (PCRs 1 and 7): the VM's configuration: the TD HOB with its
//     memory map, the ACPI tables (its vCPUs and devices), the UEFI
//     variables with the boot entries and Secure Boot databases. It
//     differs between machine shapes of the same image, and the cloud
//     changes it (a dbx update): not compared.
//   - RTMR1 (PCRs 2 to 6): the boot loader the firmware started (the UKI,
//     by its Authenticode hash), the boot disk's GPT, the ExitBootServices
//     events: the image. Compared.
//   - RTMR2 (PCRs 8 to 15): what the boot chain measured through the
//     firmware (the initrd, the UKI's sections and command line): the
//     image as it booted. Compared.
//   - RTMR3: left to the OS and applications at run time, per boot; no
//     firmware extends it, and nothing of an image says what it holds:
//     not compared.
//
// An Orrery node extends no RTMR after boot, so a node and a control
// plane of one image show the same RTMR1 and RTMR2 whenever they attest.
var PeerRTMRs = []int{1, 2}

// PeerPolicy is the policy a TD holds a peer of its own image and
// platform to (a node its join service): own's MRTD, the firmware, the
// same for every VM of the same firmware build whatever its shape, and
// own's PeerRTMRs, the image's boot chain, all enforced. Since RTMR1
// holds the image's UKI, a peer of another image fails it.
func PeerPolicy(own Measurements) Policy {
	p := Policy{MRTD: &tee.Expected{Expected: bytes.Clone(own.MRTD)}}
	for _, i := range PeerRTMRs {
		p.RTMR[i] = &tee.Expected{Expected: bytes.Clone(own.RTMR[i])}
	}
	return p
}
