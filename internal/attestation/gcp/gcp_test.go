package gcp_test

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	test "github.com/google/go-sev-guest/testing"
	"github.com/google/go-tpm-tools/client"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/gcp"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
)

// simulatedNode is a swtpm vTPM provisioned as the local cloud does, with
// a simulated SEV-SNP chip beside it: the local cloud's confidential VM,
// without the VM.
type simulatedNode struct {
	*qemutest.Node
	chip  *snpsim.Chip
	guest snpsim.Guest
	now   time.Time
}

func newSimulatedNode(t *testing.T) *simulatedNode {
	t.Helper()
	now := time.Now()
	chip, err := snpsim.NewChip(snpsim.Config{Keys: test.DefaultAmdKeys(), Now: now.Add(-time.Hour), TCB: kds.TCBParts{BlSpl: 4, SnpSpl: 22, UcodeSpl: 213}})
	if err != nil {
		t.Fatal(err)
	}
	n := &simulatedNode{Node: qemutest.NewNode(t).Boot(t, "kernel", "uki"), chip: chip, now: now}
	n.guest.Measurement[0] = 0x6f
	n.guest.Policy = abi.SnpPolicy{SMT: true}
	return n
}

func (n *simulatedNode) issuer(t *testing.T) *vtpm.Issuer {
	t.Helper()
	iss, err := gcp.NewSEVSNPIssuer(gcp.IssuerConfig{
		OpenTPM:        n.TPM.Open,
		MeasurementLog: n.Log,
		OpenTEE: func() (client.TEEDevice, error) {
			return &client.SevSnpQuoteProvider{QuoteProvider: snp.QuoteProvider{GetReport: func(d [64]byte) ([]byte, error) {
				return n.chip.ExtendedReport(n.guest, d)
			}}}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

func (n *simulatedNode) validator(t *testing.T, p snp.Policy) *vtpm.Validator {
	t.Helper()
	crl, err := n.chip.CRL(n.now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	tv, err := snp.NewVerifier(snp.Config{Policy: p, Collateral: snp.CollateralMap{n.chip.CRLURL(): crl}})
	if err != nil {
		t.Fatal(err)
	}
	m := pcrsOf(t, n)
	v, err := gcp.NewSEVSNPValidator(gcp.ValidatorConfig{
		Measurements: m,
		AKRoots:      []*x509.Certificate{n.CA.Cert},
		AKInstance:   platformca.InstanceOf,
		TEE:          tv,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// pcrsOf expects the node's PCRs 4, 9 and 11, as the image's
// measurements would.
func pcrsOf(t *testing.T, n *simulatedNode) measurements.M {
	t.Helper()
	quoted := n.PCRs(t)
	m := measurements.M{}
	for _, pcr := range []uint32{4, 9, 11} {
		m[pcr] = measurements.Measurement{Expected: quoted[pcr]}
	}
	return m
}

func (n *simulatedNode) policy(t *testing.T) snp.Policy {
	root := n.chip.TestRoot()
	return snp.Policy{Measurement: &tee.Expected{Expected: append([]byte(nil), n.guest.Measurement[:]...)}, TestRoot: &root}
}

func TestSimulatedConfidentialVMAttests(t *testing.T) {
	n := newSimulatedNode(t)
	nonce, userData := []byte("fresh nonce"), []byte("tls key")
	doc, err := n.issuer(t).Issue(context.Background(), userData, nonce)
	if err != nil {
		t.Fatal(err)
	}
	v := n.validator(t, n.policy(t))
	if v.Variant() != variant.GCPSEVSNP {
		t.Fatalf("variant %v", v.Variant())
	}
	p, err := v.ValidateProof(context.Background(), doc, nonce)
	if err != nil {
		t.Fatalf("simulated confidential VM refused: %v", err)
	}
	if string(p.UserData) != string(userData) || p.Instance != n.Instance {
		t.Errorf("proof %q %v, want %q %v", p.UserData, p.Instance, userData, n.Instance)
	}
	if !hasField(p.Hardware, "measurement", "6f00") {
		t.Errorf("hardware fields lack the launch measurement: %v", p.Hardware)
	}

	if _, err := v.ValidateProof(context.Background(), doc, []byte("another nonce")); err == nil {
		t.Fatal("a replayed attestation passed")
	}
}

func TestSimulatedConfidentialVMRefusals(t *testing.T) {
	tests := map[string]struct {
		change func(*simulatedNode, *snp.Policy)
		want   string
	}{
		"a debug guest": {
			change: func(n *simulatedNode, _ *snp.Policy) { n.guest.Policy.Debug = true },
			want:   "guest policy debug is allowed",
		},
		"other firmware": {
			change: func(n *simulatedNode, _ *snp.Policy) { n.guest.Measurement[0] = 0x70 },
			want:   "measurement is 70",
		},
		"the test root not named by the owner": {
			change: func(_ *simulatedNode, p *snp.Policy) { p.TestRoot = nil },
			want:   "could not be verified by any trusted roots",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := newSimulatedNode(t)
			p := n.policy(t)
			tc.change(n, &p)
			nonce := []byte("fresh nonce")
			doc, err := n.issuer(t).Issue(context.Background(), []byte("tls key"), nonce)
			if err != nil {
				t.Fatal(err)
			}
			_, err = n.validator(t, p).ValidateProof(context.Background(), doc, nonce)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestReportOfAnotherSessionIsRefused(t *testing.T) {
	n := newSimulatedNode(t)
	// The node's TEE signs whatever report data it is given: make it
	// answer with a report for another session, as a relay would.
	iss, err := gcp.NewSEVSNPIssuer(gcp.IssuerConfig{
		OpenTPM:        n.TPM.Open,
		MeasurementLog: n.Log,
		OpenTEE: func() (client.TEEDevice, error) {
			return &client.SevSnpQuoteProvider{QuoteProvider: snp.QuoteProvider{GetReport: func(d [64]byte) ([]byte, error) {
				d[0] ^= 1
				return n.chip.ExtendedReport(n.guest, d)
			}}}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	nonce := []byte("fresh nonce")
	doc, err := iss.Issue(context.Background(), []byte("tls key"), nonce)
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.validator(t, n.policy(t)).ValidateProof(context.Background(), doc, nonce)
	if err == nil || !strings.Contains(err.Error(), "does not bind this session") {
		t.Fatalf("got %v", err)
	}
}

func TestPlainVTPMAttestationIsRefused(t *testing.T) {
	n := newSimulatedNode(t)
	nonce := []byte("fresh nonce")
	doc, err := n.Issuer.Issue(context.Background(), []byte("tls key"), nonce)
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.validator(t, n.policy(t)).ValidateProof(context.Background(), doc, nonce)
	if err == nil || !strings.Contains(err.Error(), "no SEV-SNP report") {
		t.Fatalf("a vTPM quote without a report: got %v", err)
	}
}

func TestValidatorNeedsAHardwareVerifier(t *testing.T) {
	_, err := gcp.NewSEVSNPValidator(gcp.ValidatorConfig{Measurements: measurements.M{4: {Expected: make([]byte, 32)}}})
	if err == nil {
		t.Fatal("a gcp-sev-snp validator without an SEV-SNP verifier was made")
	}
}

func hasField(fields []attestation.Field, name, prefix string) bool {
	for _, f := range fields {
		if f.Name == name && strings.HasPrefix(f.Value, prefix) {
			return true
		}
	}
	return false
}
