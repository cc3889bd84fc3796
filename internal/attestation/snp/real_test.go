package snp

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// realEvidence is a report captured on a real AMD EPYC Milan machine with
// the VCEK certificate AMD's KDS issued for it (see testdata/README.md).
type realEvidence struct {
	report, cert string
	vlek         bool
}

var (
	realVCEK  = realEvidence{report: "testdata/milan-vcek-report.bin", cert: "testdata/milan-vcek.der"}
	realDebug = realEvidence{report: "testdata/milan-debug-report.bin", cert: "testdata/milan-debug-vcek.der"}
	realVLEK  = realEvidence{report: "testdata/milan-vlek-report.bin", cert: "testdata/milan-vlek.der", vlek: true}
)

// realVCEKMeasurement is the launch measurement in milan-vcek-report.bin,
// read from the file once; a policy must name it for the report to pass.
const realVCEKMeasurement = "a1f3930413247bb38cfc171579ea3c12d5fe4901f0c792f63fd75d98f1ef827c23500644e0e692e6be917f9050d3d38c"

// realTime is inside the validity of the real certificates (the VCEK is
// valid from 2023-01-24 to 2030-01-24).
var realTime = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

func (e realEvidence) load(t *testing.T) *spb.Attestation {
	t.Helper()
	raw, err := os.ReadFile(e.report)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := os.ReadFile(e.cert)
	if err != nil {
		t.Fatal(err)
	}
	report, err := abi.ReportToProto(raw)
	if err != nil {
		t.Fatalf("parse %s: %v", e.report, err)
	}
	chain := &spb.CertificateChain{VcekCert: cert}
	if e.vlek {
		chain = &spb.CertificateChain{VlekCert: cert}
	}
	return &spb.Attestation{Report: report, CertificateChain: chain}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// realVerifier checks real evidence under AMD's roots, without a CRL:
// AMD's CRL is not among the test data (and is only fetched from AMD).
func realVerifier(t *testing.T, p Policy, now time.Time) *Verifier {
	t.Helper()
	v, err := NewVerifier(Config{Policy: p, SkipRevocationCheck: true, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func realPolicy(t *testing.T) Policy {
	return Policy{Measurement: &tee.Expected{Expected: mustHex(t, realVCEKMeasurement)}}
}

func TestRealReportVerifies(t *testing.T) {
	att := realVCEK.load(t)
	fields, err := realVerifier(t, realPolicy(t), realTime).VerifyReport(context.Background(), att, att.GetReport().GetReportData())
	if err != nil {
		t.Fatalf("real Milan report refused: %v", err)
	}
	got := map[string]string{}
	for _, f := range fields {
		got[f.Name] = f.Value
	}
	if got["measurement"] != realVCEKMeasurement {
		t.Errorf("measurement field = %q", got["measurement"])
	}
	if got["signed by"] != "VCEK under AMD ARK" {
		t.Errorf("signed by = %q", got["signed by"])
	}
	if !strings.Contains(got["guest policy"], "debug not allowed") {
		t.Errorf("guest policy = %q", got["guest policy"])
	}
}

func TestRealReportMutationsAreRefused(t *testing.T) {
	ctx := context.Background()
	otherData := make([]byte, tee.ReportDataSize)
	tests := map[string]struct {
		mutate func(*spb.Attestation)
		policy func(*Policy)
		data   []byte
		want   string
	}{
		"a flipped bit in the measurement": {mutate: func(a *spb.Attestation) { a.Report.Measurement[0] ^= 1 }, want: "signature"},
		"a flipped bit in the signature":   {mutate: func(a *spb.Attestation) { a.Report.Signature[3] ^= 0x10 }, want: "signature"},
		"a flipped bit in the report data": {mutate: func(a *spb.Attestation) { a.Report.ReportData[0] ^= 1 }, want: "signature"},
		"a flipped bit in the VCEK certificate": {
			mutate: func(a *spb.Attestation) { a.CertificateChain.VcekCert[len(a.CertificateChain.VcekCert)-10] ^= 1 },
			want:   "VCEK",
		},
		"report data of another session": {data: otherData, want: "does not bind this session"},
		"another launch measurement": {
			policy: func(p *Policy) { p.Measurement.Expected = make([]byte, abi.MeasurementSize) },
			want:   "measurement is " + realVCEKMeasurement + ", but the policy wants 0000",
		},
		"an older TCB than the policy's minimum": {
			policy: func(p *Policy) { p.MinimumTCB = &TCB{Bootloader: 255} },
			want:   "reported TCB is bootloader 3, tee 0, snp 8, microcode 115, but the policy wants at least bootloader 255",
		},
		"a chip the policy does not list": {
			policy: func(p *Policy) { p.ChipIDs = &ChipIDs{Allowed: []HexBytes{make([]byte, abi.ChipIDSize)}} },
			want:   "chip ID is",
		},
		"a report version below the minimum": {
			policy: func(p *Policy) { p.MinimumReportVersion = &tee.MinimumVersion{Minimum: 3} },
			want:   "report version is 2, but the policy wants at least 3",
		},
		"SMT when the policy forbids it": {
			policy: func(p *Policy) { p.GuestPolicy = &GuestPolicy{AllowSMT: false} },
			want:   "guest policy is ABI 0.31, debug not allowed, SMT allowed",
		},
		"a certificate from another root": {
			policy: func(p *Policy) { p.TestRoot = otherRoot(t) },
			want:   "could not be verified by any trusted roots",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			att := realVCEK.load(t)
			p := realPolicy(t)
			if tc.policy != nil {
				tc.policy(&p)
			}
			data := append([]byte(nil), att.GetReport().GetReportData()...)
			if tc.data != nil {
				data = tc.data
			}
			if tc.mutate != nil {
				tc.mutate(att)
			}
			_, err := realVerifier(t, p, realTime).VerifyReport(ctx, att, data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRealReportWarnOnlyMismatchPasses(t *testing.T) {
	att := realVCEK.load(t)
	p := realPolicy(t)
	p.Measurement.Expected[0] ^= 1
	p.Measurement.WarnOnly = true
	p.MinimumTCB = &TCB{Microcode: 255, WarnOnly: true}
	var logged strings.Builder
	v, err := NewVerifier(Config{Policy: p, SkipRevocationCheck: true, Now: func() time.Time { return realTime }, Logger: textLogger(&logged)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.VerifyReport(context.Background(), att, att.GetReport().GetReportData()); err != nil {
		t.Fatalf("warn-only mismatches refused the report: %v", err)
	}
	for _, want := range []string{"field=measurement", `field="reported TCB"`} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logged.String())
		}
	}
}

func TestRealDebugReportIsRefused(t *testing.T) {
	att := realDebug.load(t)
	p := Policy{Measurement: &tee.Expected{Expected: append([]byte(nil), att.GetReport().GetMeasurement()...)}}
	_, err := realVerifier(t, p, realTime).VerifyReport(context.Background(), att, att.GetReport().GetReportData())
	var m *tee.Mismatch
	if !errors.As(err, &m) || m.Field != "guest policy debug" {
		t.Fatalf("real debug report: got %v, want a guest policy debug refusal", err)
	}
}

func TestRealExpiredCertificateIsRefused(t *testing.T) {
	att := realVLEK.load(t)
	p := Policy{Measurement: &tee.Expected{Expected: append([]byte(nil), att.GetReport().GetMeasurement()...)}}
	// The VLEK certificate is valid from 2024-12-10 to 2025-12-10.
	_, err := realVerifier(t, p, time.Date(2026, time.March, 1, 0, 0, 0, 0, time.UTC)).VerifyReport(context.Background(), att, att.GetReport().GetReportData())
	if err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired VLEK: got %v, want a refusal naming the expiry", err)
	}
	// Within its validity, the same evidence gets past the signature
	// check and stops at the VMPL (it came from VMPL 1).
	_, err = realVerifier(t, p, time.Date(2025, time.June, 1, 0, 0, 0, 0, time.UTC)).VerifyReport(context.Background(), att, att.GetReport().GetReportData())
	var m *tee.Mismatch
	if !errors.As(err, &m) || m.Field != "VMPL" {
		t.Fatalf("VLEK report in its validity: got %v, want the VMPL refusal", err)
	}
}
