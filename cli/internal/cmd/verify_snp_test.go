package cmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	test "github.com/google/go-sev-guest/testing"
	"github.com/google/go-tpm-tools/client"
	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation/gcp"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// TestVerifySEVSNP runs 'orrery verify' against a simulated SEV-SNP node
// (a swtpm vTPM and a simulated chip, as the local cloud's VMs have):
// with the test root named it prints the verified report; without it,
// or with measurements that expect a plain vTPM node, it refuses.
func TestVerifySEVSNP(t *testing.T) {
	n := qemutest.NewNode(t).Boot(t, "kernel", "uki")
	var guest snpsim.Guest
	guest.Measurement[0] = 0x5e
	guest.Policy = abi.SnpPolicy{SMT: true}
	addr, chip := serveSNPNode(t, n, guest)

	dir := t.TempDir()
	quoted := n.PCRs(t)
	pcrs := measurements.M{15: {Expected: make([]byte, 32)}}
	for _, pcr := range []uint32{4, 9, 11} {
		pcrs[pcr] = measurements.Measurement{Expected: quoted[pcr]}
	}
	write := func(name string, p policy.Policy) string {
		raw, err := p.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	plain := write("measurements.json", policy.Policy{PCRs: pcrs})
	withSNP := write("measurements-sev-snp.json", policy.Policy{PCRs: pcrs, SEVSNP: &snp.Policy{Measurement: &tee.Expected{Expected: guest.Measurement[:]}}})
	root := filepath.Join(dir, snpTestRootFile)
	if err := chip.WriteTestRoot(root, time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}

	tests := map[string]struct {
		args             []string
		wantCode         int
		wantOut, wantErr []string
	}{
		"the test root named": {
			args:    []string{"--measurements", withSNP, "--snp-test-root", root},
			wantOut: []string{"attested as gcp-sev-snp", "Its hardware report (verified):", "measurement:     5e00", "debug not allowed", "NOT A REAL CPU"},
		},
		"the test root not named": {
			args:     []string{"--measurements", withSNP},
			wantCode: 1, wantErr: []string{"could not be verified by any trusted roots", "--snp-test-root"},
		},
		"measurements for plain vTPM nodes": {
			args:     []string{"--measurements", plain},
			wantCode: 1, wantErr: []string{"gcp-sev-snp, which this side does not accept"},
		},
		"a test root for measurements without an SEV-SNP section": {
			args:     []string{"--measurements", plain, "--snp-test-root", root},
			wantCode: 1, wantErr: []string{`no "sevSnp" section`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"verify", "--node", addr, "--timeout", "20s", "--platform-ca", n.CAFile(t)}, tc.args...)
			if code := Execute(context.Background(), args, &out, &errOut); code != tc.wantCode {
				t.Fatalf("exit code %d, want %d; stdout: %s; stderr: %s", code, tc.wantCode, out.String(), errOut.String())
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut.String())
				}
			}
		})
	}
}

// serveSNPNode serves aTLS as node n on a simulated SEV-SNP chip that
// reports guest, and returns the server's address and the chip.
func serveSNPNode(t *testing.T, n *qemutest.Node, guest snpsim.Guest) (string, *snpsim.Chip) {
	t.Helper()
	chip, err := snpsim.NewChip(snpsim.Config{Keys: test.DefaultAmdKeys(), Now: time.Now().Add(-time.Hour), TCB: kds.TCBParts{BlSpl: 4, SnpSpl: 22, UcodeSpl: 213}})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := gcp.NewSEVSNPIssuer(gcp.IssuerConfig{OpenTPM: n.TPM.Open, MeasurementLog: n.Log,
		OpenTEE: func() (client.TEEDevice, error) {
			return &client.SevSnpQuoteProvider{QuoteProvider: snp.QuoteProvider{GetReport: func(d [64]byte) ([]byte, error) {
				return chip.ExtendedReport(guest, d)
			}}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return atlstest.Serve(t, atls.Config{Issuer: iss}, func(*grpc.Server) {}), chip
}
