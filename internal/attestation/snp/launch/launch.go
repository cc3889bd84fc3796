// Package launch computes the SEV-SNP launch measurement of a firmware
// image: the digest an AMD Secure Processor accumulates while the host
// hands it the guest's initial pages (SNP_LAUNCH_UPDATE), which the
// guest's attestation reports carry as MEASUREMENT.
//
// Each 4 KiB page extends the digest with its PAGE_INFO structure, as the
// SEV-SNP firmware ABI specification (AMD publication 56860, "PAGE_INFO")
// defines it: the digest so far, the page's SHA-384, the structure's
// length, the page type, permissions and the page's guest-physical
// address. The firmware is mapped, as QEMU maps a pflash firmware, so
// that it ends at 4 GiB.
//
// Only the firmware's own pages are measured. A real SEV-SNP launch also
// measures the pages an SEV-enabled firmware's metadata asks for (zero,
// secrets and CPUID pages) and each vCPU's initial register state (VMSA),
// which depend on the firmware build and the VM's CPU model. The local
// cloud's simulated chip and the image build both use this function, so
// the image predicts exactly what the simulated reports carry; a real
// platform's value comes from the cloud's published launch endorsement
// (see docs/confidential-clouds.md).
package launch

import (
	"crypto/sha512"
	"encoding/binary"
	"fmt"
	"os"
)

// Size is the size of a launch measurement (SHA-384).
const Size = sha512.Size384

const (
	pageSize       = 4096
	pageInfoLength = 0x70
	pageTypeNormal = 0x01
	fourGiB        = 1 << 32
)

// Firmware returns the launch measurement of a guest that starts with
// firmware mapped below 4 GiB and nothing else.
func Firmware(firmware []byte) ([Size]byte, error) {
	var digest [Size]byte
	if len(firmware) == 0 || len(firmware)%pageSize != 0 {
		return digest, fmt.Errorf("firmware image has %d bytes, not a whole number of 4 KiB pages", len(firmware))
	}
	if len(firmware) > 64<<20 {
		return digest, fmt.Errorf("firmware image has %d bytes, more than a pflash firmware can (64 MiB)", len(firmware))
	}
	base := uint64(fourGiB - len(firmware))
	for off := 0; off < len(firmware); off += pageSize {
		contents := sha512.Sum384(firmware[off : off+pageSize])
		digest = extend(digest, contents, pageTypeNormal, base+uint64(off))
	}
	return digest, nil
}

// FirmwareFile is Firmware of the file at path.
func FirmwareFile(path string) ([Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return [Size]byte{}, fmt.Errorf("read the firmware for its SEV-SNP launch measurement: %w", err)
	}
	return Firmware(b)
}

// extend hashes one PAGE_INFO: the current digest, the page contents'
// digest, the structure's length, page type, IMI flag (0), the VMPL 3, 2
// and 1 permissions (0: none), a reserved byte, and the GPA.
func extend(cur [Size]byte, contents [Size]byte, pageType byte, gpa uint64) [Size]byte {
	var info [pageInfoLength]byte
	copy(info[0:], cur[:])
	copy(info[Size:], contents[:])
	binary.LittleEndian.PutUint16(info[2*Size:], pageInfoLength)
	info[2*Size+2] = pageType
	binary.LittleEndian.PutUint64(info[2*Size+8:], gpa)
	return sha512.Sum384(info[:])
}
