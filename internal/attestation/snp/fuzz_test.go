package snp

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// FuzzParsePolicy feeds the policy decoder arbitrary text: it must never
// panic, and a policy it accepts must pass Validate and survive a
// round trip.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(`{"measurement": {"expected": "` + realVCEKMeasurement + `"}}`))
	f.Add([]byte(`{"measurement": {"expected": "00"}, "chipIds": {"allowed": ["zz"]}}`))
	f.Add([]byte(`{"measurement": {"expected": "` + realVCEKMeasurement + `"}, "testRoot": {"notARealCpu": true, "ark": "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n", "ask": ""}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("ParsePolicy accepted a policy Validate refuses: %v", err)
		}
	})
}

// FuzzVerifyReport feeds a peer's report bytes, parsed by go-sev-guest,
// to the verifier with the real VCEK: it must never panic, and nothing
// but the genuine report may pass.
func FuzzVerifyReport(f *testing.F) {
	genuine, err := os.ReadFile(realVCEK.report)
	if err != nil {
		f.Fatal(err)
	}
	vcek, err := os.ReadFile(realVCEK.cert)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(genuine)
	f.Add(genuine[:abi.ReportSize-1])
	v, err := NewVerifier(Config{Policy: Policy{Measurement: &tee.Expected{Expected: make([]byte, abi.MeasurementSize)}}, SkipRevocationCheck: true, Now: func() time.Time { return realTime }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		report, err := abi.ReportToProto(raw)
		if err != nil {
			return
		}
		att := &spb.Attestation{Report: report, CertificateChain: &spb.CertificateChain{VcekCert: vcek}}
		// The policy's measurement is all zeros, which the genuine
		// report does not have: every input must be refused.
		if _, err := v.VerifyReport(context.Background(), att, report.GetReportData()); err == nil {
			t.Fatalf("a report passed a policy no genuine report meets")
		}
	})
}
