package cloud

import (
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/abi"

	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/launch"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
)

// The simulated chip signs reports for a cloud's nodes that the owner's
// policy accepts once it names the test root the cloud wrote; a node set
// to debug is refused; and a second start keeps the same chip.
func TestSimulatedSEVSNPChip(t *testing.T) {
	fw := vm.DefaultFirmware().Code
	if _, err := os.Stat(fw); err != nil {
		t.Skipf("no OVMF firmware (%v): run 'make deps'", err)
	}
	dir := t.TempDir()
	c := &Cloud{spec: Spec{Dir: dir, SEVSNP: true}, nodes: []*Node{{Name: "cp-0"}, {Name: "worker-0"}}}
	if err := c.startChip(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, SEVSNPTestRoot))
	if err != nil {
		t.Fatal(err)
	}
	want, err := launch.FirmwareFile(fw)
	if err != nil {
		t.Fatal(err)
	}
	p, err := snp.ParsePolicy([]byte(`{"measurement":{"expected":"` + hex.EncodeToString(want[:]) + `"},"testRoot":` + string(raw) + `}`))
	if err != nil {
		t.Fatal(err)
	}
	v, err := snp.NewVerifier(snp.Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	verify := func(name string) error {
		var data [64]byte
		copy(data[:], name)
		ext, err := c.sevSNPReport(name, data)
		if err != nil {
			t.Fatal(err)
		}
		att, err := abi.ReportCertsToProto(ext)
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.VerifyReport(context.Background(), att, data[:])
		return err
	}
	if err := verify("worker-0"); err != nil {
		t.Fatalf("a report of the simulated chip refused under the cloud's test root: %v", err)
	}
	if err := c.SetSEVSNPDebug("worker-0", true); err != nil {
		t.Fatal(err)
	}
	if err := verify("worker-0"); err == nil || !strings.Contains(err.Error(), "debug") {
		t.Fatalf("a report of a debug VM: %v", err)
	}
	if err := verify("cp-0"); err != nil {
		t.Fatalf("another node's reports changed with worker-0's debug: %v", err)
	}
	if _, err := c.sevSNPReport("spare-9", [64]byte{}); err == nil {
		t.Fatal("a report for a node the cloud does not have")
	}
	again, err := snpsim.Load(dir)
	if err != nil || !again.VCEK().Equal(c.chip.VCEK()) {
		t.Fatalf("the saved chip is not the one in use: %v", err)
	}
}
