package tdx

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/abi"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/orrery-dev/orrery/internal/attestation/tdx/tdxtest"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// These tests carry the real TD report body, re-signed under a test PKI
// (see tdxtest.PKI), through go-tdx-guest's verification to the checks that
// follow it.

// resigned is a verifier trusting pki, at realTime, with collateral per
// spec, and the real quote sealed by pki after body changed its TD
// report body.
func resigned(t *testing.T, pki *tdxtest.PKI, policy Policy, spec collateralSpec, body func(*tdxpb.TDQuoteBody)) (*Verifier, *tdxpb.QuoteV4, *bytes.Buffer) {
	t.Helper()
	q := parseQuote(t, realQuoteRaw(t))
	if body != nil {
		body(q.GetTdQuoteBody())
	}
	var log bytes.Buffer
	v, err := NewVerifier(Config{
		Policy: policy, Collateral: collateralOf(t, pki, spec), Now: fixedClock(realTime),
		TrustedRoots: pki.Roots(), Logger: textLogger(&log),
	})
	if err != nil {
		t.Fatal(err)
	}
	return v, pki.Seal(t, q), &log
}

func TestResignedRealQuoteAccepted(t *testing.T) {
	pki := newTestPKI(t)
	v, q, log := resigned(t, pki, realPolicy(t), collateralSpec{}, nil)
	// Through the wire form too: the sealed quote must be well formed.
	raw, err := abi.QuoteToAbiBytes(q)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.VerifyQuote(context.Background(), parseQuote(t, raw), mustHex(t, realReportData))
	if err != nil {
		t.Fatalf("VerifyQuote() = %v", err)
	}
	want := []tee.Field{
		{Name: "MRTD", Value: realMRTD},
		{Name: "RTMR0", Value: realRTMR0}, {Name: "RTMR1", Value: realRTMR1},
		{Name: "RTMR2", Value: realRTMR2}, {Name: "RTMR3", Value: realRTMR3},
		{Name: "MRSEAM", Value: realMRSEAM},
		{Name: "TD attributes", Value: realTDAttrs + " (PKS)"},
		{Name: "XFAM", Value: "e71a060000000000"},
		{Name: "TEE TCB SVN", Value: realTEETCBSVN},
		{Name: "TDX TCB status", Value: "UpToDate, TCB date 2023-02-15T00:00:00Z"},
		{Name: "QE SVN", Value: "0"},
		{Name: "QE report ISV SVN", Value: "4"},
		{Name: "QE TCB status", Value: "UpToDate, TCB date 2023-02-15T00:00:00Z"},
	}
	if len(got) != len(want) {
		t.Fatalf("fields = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d = %v, want %v", i, got[i], want[i])
		}
	}
	if log.Len() != 0 {
		t.Errorf("logged %q, want nothing", log.String())
	}
}

func TestResignedRefused(t *testing.T) {
	pki := newTestPKI(t)
	tests := map[string]struct {
		body       func(*tdxpb.TDQuoteBody)
		afterSeal  func(*tdxpb.QuoteV4)
		spec       collateralSpec
		reportData []byte
		config     func(*Config)
		wantErr    error
	}{
		"PCK certificate revoked":        {spec: collateralSpec{revokePCK: true}, wantErr: ErrRevoked},
		"TDX TCB out of date":            {spec: collateralSpec{tdxStatus: "OutOfDate"}, wantErr: ErrTCBNotUpToDate},
		"TDX TCB needs SW hardening":     {spec: collateralSpec{tdxStatus: "SWHardeningNeeded"}, wantErr: ErrTCBNotUpToDate},
		"TDX TCB revoked":                {spec: collateralSpec{tdxStatus: "Revoked"}, wantErr: ErrTCBNotUpToDate},
		"QE TCB out of date":             {spec: collateralSpec{qeStatus: "OutOfDate"}, wantErr: ErrTCBNotUpToDate},
		"report data of another session": {reportData: tee.ReportData([]byte("another nonce"), []byte("another key")), wantErr: ErrNotBound},
		"TD report body changed after sealing": {
			afterSeal: func(q *tdxpb.QuoteV4) { q.TdQuoteBody.MrTd[0] ^= 1 }, wantErr: ErrSignature,
		},
		"debug attribute set after sealing": {
			afterSeal: func(q *tdxpb.QuoteV4) { q.TdQuoteBody.TdAttributes[0] |= tdAttributesDebug }, wantErr: ErrSignature,
		},
		"signature bit flipped": {
			afterSeal: func(q *tdxpb.QuoteV4) { q.SignedData.Signature[40] ^= 1 }, wantErr: ErrSignature,
		},
		"XFAM bit no TD may have": {
			body: func(b *tdxpb.TDQuoteBody) { b.Xfam[7] |= 0x80 }, wantErr: ErrQuoteFieldsRejected,
		},
		"PCK chain from another root": {
			config: func(c *Config) { c.TrustedRoots = freshRoot(t) }, wantErr: ErrUntrustedRoot,
		},
		"revoked, but revocation not checked": {
			spec: collateralSpec{revokePCK: true}, config: func(c *Config) { c.SkipRevocationCheck = true },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q := parseQuote(t, realQuoteRaw(t))
			if tc.body != nil {
				tc.body(q.GetTdQuoteBody())
			}
			q = pki.Seal(t, q)
			if tc.afterSeal != nil {
				tc.afterSeal(q)
			}
			cfg := Config{Policy: realPolicy(t), Collateral: collateralOf(t, pki, tc.spec), Now: fixedClock(realTime), TrustedRoots: pki.Roots()}
			if tc.config != nil {
				tc.config(&cfg)
			}
			v, err := NewVerifier(cfg)
			if err != nil {
				t.Fatal(err)
			}
			rd := tc.reportData
			if rd == nil {
				rd = mustHex(t, realReportData)
			}
			_, err = v.VerifyQuote(context.Background(), q, rd)
			t.Log(err)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("VerifyQuote() = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// resignedPolicyCase changes the TD report body before it is sealed, or
// the policy, and says what must be refused and what logged.
type resignedPolicyCase struct {
	body         func(*tdxpb.TDQuoteBody)
	policy       func(*Policy)
	wantMismatch []string // fields of the enforced mismatches
	wantLog      []string
}

func resignedPolicyCases(t *testing.T) map[string]resignedPolicyCase {
	other := bytes.Repeat([]byte{0xab}, 48)
	return map[string]resignedPolicyCase{
		"debug TD, whatever the policy": {
			body:         func(b *tdxpb.TDQuoteBody) { b.TdAttributes[0] |= tdAttributesDebug },
			policy:       func(p *Policy) { p.TDAttributes = nil },
			wantMismatch: []string{"tdAttributes.DEBUG"},
		},
		"MRTD differs": {
			policy: func(p *Policy) { p.MRTD.Expected = other }, wantMismatch: []string{"mrtd"},
		},
		"RTMR2 differs": {
			body: func(b *tdxpb.TDQuoteBody) { b.Rtmrs[2][47] ^= 1 }, wantMismatch: []string{"rtmr2"},
		},
		"MRSEAM differs": {
			body: func(b *tdxpb.TDQuoteBody) { b.MrSeam[0] ^= 1 }, wantMismatch: []string{"mrseam"},
		},
		"TD attributes differ": {
			body: func(b *tdxpb.TDQuoteBody) { b.TdAttributes[3] |= 0x10 }, wantMismatch: []string{"tdAttributes"},
		},
		"TEE TCB SVN under the minimum": {
			policy:       func(p *Policy) { p.MinimumTEETCBSVN.Minimum[2] = 5 },
			wantMismatch: []string{"minimumTeeTcbSvn"},
		},
		"QE SVN under the minimum": {
			policy: func(p *Policy) { p.MinimumQESVN.Minimum = 1 }, wantMismatch: []string{"minimumQeSvn"},
		},
		"every enforced mismatch is reported": {
			body:         func(b *tdxpb.TDQuoteBody) { b.Rtmrs[0][0] ^= 1 },
			policy:       func(p *Policy) { p.MRTD.Expected = other },
			wantMismatch: []string{"mrtd", "rtmr0"},
		},
		"warn-only MRTD differs": {
			policy:  func(p *Policy) { p.MRTD = &tee.Expected{Expected: other, WarnOnly: true} },
			wantLog: []string{"field=mrtd", "seen=" + realMRTD, "wanted=" + strings.Repeat("ab", 48)},
		},
		"warn-only RTMR1 differs, enforced RTMR3 too": {
			body: func(b *tdxpb.TDQuoteBody) { b.Rtmrs[1][0] ^= 1; b.Rtmrs[3][0] ^= 1 },
			policy: func(p *Policy) {
				p.RTMR[1].WarnOnly = true
			},
			wantMismatch: []string{"rtmr3"},
			wantLog:      []string{"field=rtmr1"},
		},
		"warn-only minimum TEE TCB SVN": {
			policy: func(p *Policy) {
				p.MinimumTEETCBSVN = &MinimumSVN{Minimum: mustHex(t, "09000000000000000000000000000000"), WarnOnly: true}
			},
			wantLog: []string{"field=minimumTeeTcbSvn", "seen=" + realTEETCBSVN},
		},
	}
}

func TestResignedPolicy(t *testing.T) {
	pki := newTestPKI(t)
	for name, tc := range resignedPolicyCases(t) {
		t.Run(name, func(t *testing.T) {
			p := realPolicy(t)
			if tc.policy != nil {
				tc.policy(&p)
			}
			v, q, log := resigned(t, pki, p, collateralSpec{}, tc.body)
			_, err := v.VerifyQuote(context.Background(), q, mustHex(t, realReportData))
			t.Log(err)
			if got := mismatches(err); strings.Join(got, ",") != strings.Join(tc.wantMismatch, ",") {
				t.Fatalf("VerifyQuote() = %v; mismatched fields %q, want %q", err, got, tc.wantMismatch)
			}
			if len(tc.wantMismatch) == 0 && err != nil {
				t.Fatalf("VerifyQuote() = %v", err)
			}
			for _, s := range tc.wantLog {
				if !strings.Contains(log.String(), s) {
					t.Errorf("log %q does not say %q", log.String(), s)
				}
			}
			if len(tc.wantLog) == 0 && log.Len() != 0 {
				t.Errorf("logged %q, want nothing", log.String())
			}
		})
	}
}

// TestMismatchSaysSeenAndWanted checks what an owner reads.
func TestMismatchSaysSeenAndWanted(t *testing.T) {
	pki := newTestPKI(t)
	p := realPolicy(t)
	p.MRTD.Expected = bytes.Repeat([]byte{0xcd}, 48)
	v, q, _ := resigned(t, pki, p, collateralSpec{}, nil)
	_, err := v.VerifyQuote(context.Background(), q, mustHex(t, realReportData))
	var m *tee.Mismatch
	if !errors.As(err, &m) {
		t.Fatalf("VerifyQuote() = %v, want a *tee.Mismatch", err)
	}
	if m.Seen != realMRTD || m.Wanted != strings.Repeat("cd", 48) {
		t.Errorf("mismatch seen %s, wanted %s", m.Seen, m.Wanted)
	}
}

// mismatches lists the fields of every *tee.Mismatch in err's tree.
func mismatches(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if m, ok := err.(*tee.Mismatch); ok { //nolint:errorlint // the error as Verify returns it, unwrapped
			out = append(out, m.Field)
			return
		}
		switch u := err.(type) { //nolint:errorlint // walks the tree itself
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

func TestSkipRevocationCheckWarns(t *testing.T) {
	pki := newTestPKI(t)
	q := pki.Seal(t, parseQuote(t, realQuoteRaw(t)))
	var log bytes.Buffer
	v, err := NewVerifier(Config{
		Policy: realPolicy(t), Collateral: collateralOf(t, pki, collateralSpec{revokePCK: true}), Now: fixedClock(realTime),
		TrustedRoots: pki.Roots(), SkipRevocationCheck: true, Logger: textLogger(&log),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.VerifyQuote(context.Background(), q, mustHex(t, realReportData)); err != nil {
		t.Fatalf("VerifyQuote() = %v", err)
	}
	if !strings.Contains(log.String(), "revocation check skipped") {
		t.Errorf("log %q does not warn that revocation was not checked", log.String())
	}
}
