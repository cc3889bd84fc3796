// Package qemutest gives tests an attesting node without a VM: a real swtpm
// provisioned by a test platform CA, a measurement log, and the QEMU vTPM
// issuer over both, as the local cloud and a booted node would have them.
package qemutest

import (
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-tpm-tools/client"
	tpmpb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

// Node is a provisioned vTPM with its issuer.
type Node struct {
	TPM *swtpm.Instance
	CA  *platformca.CA
	// Instance is what the AK certificate names (zero: nothing).
	Instance attestation.Instance
	Log      *pcrlog.Log
	Issuer   *vtpm.Issuer
}

// DefaultName is the instance name of a node made by NewNode or NewNodeOf.
const DefaultName = "worker-0"

// NewNode starts and provisions a vTPM under a platform CA of its own; it
// stops when the test ends. Its AK certificate names an instance called
// DefaultName with a fresh ID.
func NewNode(tb testing.TB) *Node {
	tb.Helper()
	ca, err := platformca.New("test platform CA")
	if err != nil {
		tb.Fatal(err)
	}
	return NewNodeOf(tb, ca)
}

// NewNodeOf starts a vTPM provisioned by ca: another node of the same
// platform as every node ca provisioned, called DefaultName.
func NewNodeOf(tb testing.TB, ca *platformca.CA) *Node {
	tb.Helper()
	return NewInstance(tb, ca, platformca.NewInstance(DefaultName))
}

// NewInstance starts a vTPM provisioned by ca for instance inst. The zero
// Instance provisions it as the local cloud did before it named
// instances: an AK certificate without an instance.
func NewInstance(tb testing.TB, ca *platformca.CA, inst attestation.Instance) *Node {
	tb.Helper()
	n := &Node{TPM: swtpmtest.Start(tb), CA: ca, Instance: inst, Log: &pcrlog.Log{Path: filepath.Join(tb.TempDir(), "measurements.log")}}
	var err error
	rw := swtpmtest.Open(tb, n.TPM)
	if _, err := n.CA.ProvisionAK(rw, inst); err != nil {
		tb.Fatalf("provision AK: %v", err)
	}
	rw.Close()
	if n.Issuer, err = qemu.NewIssuer(qemu.IssuerConfig{OpenTPM: n.TPM.Open, MeasurementLog: n.Log}); err != nil {
		tb.Fatal(err)
	}
	return n
}

// Measure extends pcr with data, as the node's initrd or lock would.
func (n *Node) Measure(tb testing.TB, pcr uint32, data, description string) {
	tb.Helper()
	rw := swtpmtest.Open(tb, n.TPM)
	defer rw.Close()
	if err := n.Log.Measure(rw, pcr, []byte(data), description); err != nil {
		tb.Fatal(err)
	}
}

// CAFile writes the platform CA certificate as PEM and returns its path.
func (n *Node) CAFile(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), platformca.CertFile)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: n.CA.Cert.Raw}), 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Boot measures what a boot does on a node: the firmware measures the
// kernel and initrd of kernelImage into PCRs 4 and 9, the UKI of ukiImage
// its sections into PCR 11, the initrd its phase markers after them. Two
// nodes booted with the same names show the same PCRs.
func (n *Node) Boot(tb testing.TB, kernelImage, ukiImage string) *Node {
	tb.Helper()
	n.Measure(tb, 4, kernelImage+" kernel", "firmware: kernel")
	n.Measure(tb, 9, kernelImage+" initrd", "firmware: initrd")
	n.Measure(tb, 11, ukiImage+" uki", "uki: sections")
	n.Measure(tb, 11, "enter-initrd", "initrd: enter-initrd")
	n.Measure(tb, 11, "leave-initrd", "initrd: leave-initrd")
	return n
}

// Lock extends PCR 15 as the node lock does, for a cluster of that name.
func (n *Node) Lock(tb testing.TB, cluster string) *Node {
	tb.Helper()
	n.Measure(tb, 15, cluster, "node lock: cluster ID")
	return n
}

// Firmware replays a firmware's TCG event log (a real VM's
// binary_bios_measurements) into the node's SHA-256 PCRs and makes the
// issuer send it with every attestation: the node then shows that VM's
// firmware-measured PCRs (4 and 9 among them), as a control plane booted
// the same way would. Call it before any other measurement.
func (n *Node) Firmware(tb testing.TB, log []byte) *Node {
	tb.Helper()
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		tb.Fatalf("parse the firmware event log: %v", err)
	}
	rw := swtpmtest.Open(tb, n.TPM)
	defer rw.Close()
	for _, e := range el.Events(register.HashSHA256) {
		if e.Type == tcg.NoAction {
			if e.Index == 0 && strings.HasPrefix(string(e.Data), "StartupLocality") && e.Data[len(e.Data)-1] != 0 {
				tb.Fatal("the firmware started the TPM in another locality than 0, which a swtpm cannot replay")
			}
			continue
		}
		if err := tpm2.PCRExtend(rw, tpmutil.Handle(e.Index), tpm2.AlgSHA256, e.Digest, ""); err != nil {
			tb.Fatalf("replay firmware event %d into PCR %d: %v", e.Num(), e.Index, err)
		}
	}
	path := filepath.Join(tb.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(path, log, 0o644); err != nil {
		tb.Fatal(err)
	}
	if n.Issuer, err = qemu.NewIssuer(qemu.IssuerConfig{OpenTPM: n.TPM.Open, MeasurementLog: n.Log, FirmwareEventLogPath: path}); err != nil {
		tb.Fatal(err)
	}
	return n
}

// PCRs reads the node's SHA-256 PCRs: what a verifier that expects this
// node's state would write in its measurements.
func (n *Node) PCRs(tb testing.TB) map[uint32][]byte {
	tb.Helper()
	rw := swtpmtest.Open(tb, n.TPM)
	defer rw.Close()
	pcrs, err := client.ReadAllPCRs(rw)
	if err != nil {
		tb.Fatal(err)
	}
	for _, bank := range pcrs {
		if bank.GetHash() == tpmpb.HashAlgo_SHA256 {
			return bank.GetPcrs()
		}
	}
	tb.Fatal("the vTPM has no SHA-256 PCR bank")
	return nil
}
