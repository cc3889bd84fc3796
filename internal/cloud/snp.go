package cloud

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"

	"github.com/orrery-dev/orrery/internal/attestation/snp/launch"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
)

// simulatedTCB is the firmware level the simulated chip reports: that of
// an up-to-date Milan host of 2025 (bootloader 4, SNP 22, microcode 213).
var simulatedTCB = kds.TCBParts{BlSpl: 4, SnpSpl: 22, UcodeSpl: 213}

// startChip loads the cloud's simulated chip from Dir, or makes one, and
// writes its test root for the owner; it computes the VMs' launch
// measurement from the firmware they boot.
func (c *Cloud) startChip() error {
	chip, err := snpsim.Load(c.spec.Dir)
	if errors.Is(err, os.ErrNotExist) {
		c.progress("SEV-SNP: making the simulated chip's test root (RSA-4096 keys)")
		var id [abi.ChipIDSize]byte
		if _, err := rand.Read(id[:]); err != nil {
			return err
		}
		chip, err = snpsim.NewChip(snpsim.Config{ChipID: id, TCB: simulatedTCB, Now: time.Now().Add(-24 * time.Hour)})
		if err == nil {
			err = chip.Save(c.spec.Dir)
		}
	}
	if err != nil {
		return err
	}
	if err := chip.WriteTestRoot(filepath.Join(c.spec.Dir, SEVSNPTestRoot), time.Now().Add(-time.Hour)); err != nil {
		return fmt.Errorf("write the test root for the owner: %w", err)
	}
	fw := vm.DefaultFirmware().Code
	if c.launch, err = launch.FirmwareFile(fw); err != nil {
		return err
	}
	c.chip = chip
	c.progress("SEV-SNP: VMs are simulated SEV-SNP VMs; launch measurement of %s: %x", fw, c.launch)
	return nil
}

// sevSNPReport is the simulated AMD Secure Processor of node name.
func (c *Cloud) sevSNPReport(name string, reportData [64]byte) ([]byte, error) {
	c.mu.Lock()
	i := slices.IndexFunc(c.nodes, func(n *Node) bool { return n.Name == name })
	debug := i >= 0 && c.nodes[i].SEVSNPDebug
	c.mu.Unlock()
	if i < 0 {
		return nil, fmt.Errorf("no node %s", name)
	}
	return c.chip.ExtendedReport(snpsim.Guest{
		Measurement: c.launch,
		Policy:      abi.SnpPolicy{SMT: true, Debug: debug},
	}, reportData)
}

// SetSEVSNPDebug makes the simulated chip sign node name's reports from
// now on with the debug policy bit set (or not), as it would for a VM
// the host launched with it to read its memory. A test hook: real
// hardware fixes a guest's policy at launch, and a verifier must refuse
// such a VM either way.
func (c *Cloud) SetSEVSNPDebug(name string, on bool) error {
	if !c.spec.SEVSNP {
		return errors.New("cloud: not a cloud of simulated SEV-SNP VMs (Spec.SEVSNP)")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Name == name {
			n.SEVSNPDebug = on
			return nil
		}
	}
	return fmt.Errorf("cloud: no node %s", name)
}
