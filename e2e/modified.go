//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/imagebuild/uki"
	"github.com/orrery-dev/orrery/internal/nodepackages"
)

// snpMeasurements is an image's measurements file for SEV-SNP VMs.
const snpMeasurements = "measurements-sev-snp.json"

// modifiedImage writes into dir a copy of the image in imgDir whose UKI
// carries one more kernel command-line word, and returns its qcow2. It is
// what an attacker who edits a node's boot entry gets: the same signed-off
// kernel, initrd and root file system, and other PCRs 4, 9 and 11. It also
// writes the image's predicted measurements.json into dir, as 'make image'
// would (for a test that makes the cluster accept the image).
func modifiedImage(ctx context.Context, imgDir, dir, word string) (string, error) {
	orig, err := os.ReadFile(filepath.Join(imgDir, "uki.efi"))
	if err != nil {
		return "", err
	}
	sections, err := uki.Sections(orig)
	if err != nil {
		return "", fmt.Errorf("read the image's UKI: %w", err)
	}
	// The systemd-stub the image build pins and used.
	stub, err := nodepackages.Stub()
	if err != nil {
		return "", err
	}
	stubImg, err := os.ReadFile(stub)
	if err != nil {
		return "", err
	}
	cmdline := string(sections[uki.Cmdline]) + " " + word
	img, err := uki.Assemble(stubImg, []uki.Section{
		{Name: uki.OSRel, Data: sections[uki.OSRel]},
		{Name: uki.Cmdline, Data: []byte(cmdline)},
		{Name: uki.Initrd, Data: sections[uki.Initrd]},
		{Name: uki.Linux, Data: sections[uki.Linux]},
	})
	if err != nil {
		return "", err
	}
	ukiPath := filepath.Join(dir, "uki.efi")
	if err := os.WriteFile(ukiPath, img, 0o644); err != nil {
		return "", err
	}
	raw := filepath.Join(dir, "disk.raw")
	if err := run(ctx, "cp", "--sparse=always", filepath.Join(imgDir, "disk.raw"), raw); err != nil {
		return "", err
	}
	offset, err := espOffset(ctx, raw)
	if err != nil {
		return "", err
	}
	if err := run(ctx, "mcopy", "-o", "-i", fmt.Sprintf("%s@@%d", raw, offset), ukiPath, "::EFI/BOOT/BOOTX64.EFI"); err != nil {
		return "", err
	}
	// The image build's own prediction, run from the repository root.
	measure := exec.CommandContext(ctx, "go", "run", "./image/nodeimage", "measure", "-uki", ukiPath, "-disk", raw,
		"-firmware", "image/firmware-pcrs.json", "-out", filepath.Join(dir, "measurements.json"), "-events", filepath.Join(dir, "measurements.log"),
		"-sev-snp-firmware", vm.DefaultFirmware().Code, "-sev-snp-out", filepath.Join(dir, snpMeasurements))
	measure.Dir = ".."
	if out, err := measure.CombinedOutput(); err != nil {
		return "", fmt.Errorf("predict the modified image's measurements: %w\n%s", err, out)
	}
	qcow := filepath.Join(dir, "disk.qcow2")
	if err := run(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow); err != nil {
		return "", err
	}
	return qcow, os.Remove(raw)
}

// espOffset returns the byte offset of the disk's EFI system partition.
func espOffset(ctx context.Context, disk string) (int64, error) {
	out, err := exec.CommandContext(ctx, "sfdisk", "--json", disk).Output()
	if err != nil {
		return 0, fmt.Errorf("sfdisk --json %s: %w", disk, err)
	}
	var table struct {
		PartitionTable struct {
			SectorSize int64 `json:"sectorsize"`
			Partitions []struct {
				Start int64  `json:"start"`
				Type  string `json:"type"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &table); err != nil {
		return 0, fmt.Errorf("sfdisk --json %s: %w", disk, err)
	}
	const espType = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	for _, p := range table.PartitionTable.Partitions {
		if p.Type == espType {
			size := table.PartitionTable.SectorSize
			if size == 0 {
				size = 512
			}
			return p.Start * size, nil
		}
	}
	return 0, fmt.Errorf("%s has no EFI system partition", disk)
}

func run(ctx context.Context, name string, args ...string) error {
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, out)
	}
	return nil
}
