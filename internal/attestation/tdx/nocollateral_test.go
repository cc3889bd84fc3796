package tdx

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// Verification without collateral (Config.SkipCollateral) is what a node
// does to its join service: no cache, so no revocation and no TCB status,
// but the signatures, the PCK chain to the trusted root, and Intel's
// identities of the QE and the TDX module.

// TestRealQuoteWithoutCollateral verifies real evidence under Intel's
// real root, with no cache at all.
func TestRealQuoteWithoutCollateral(t *testing.T) {
	var log bytes.Buffer
	v, err := NewVerifier(Config{Policy: upToDatePolicy(t), SkipCollateral: true, Now: fixedClock(upToDateTime), Logger: textLogger(&log)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.VerifyQuote(context.Background(), parseQuote(t, upToDateQuoteRaw(t)), mustHex(t, upToDateReportData))
	if err != nil {
		t.Fatalf("VerifyQuote() = %v", err)
	}
	for _, f := range got {
		if strings.HasSuffix(f.Name, "TCB status") && f.Value != "not checked (verified without Intel's collateral)" {
			t.Errorf("%s = %q, but no collateral was read", f.Name, f.Value)
		}
	}
	if !strings.Contains(log.String(), "without Intel's collateral") {
		t.Errorf("log %q does not warn that the collateral was not used", log.String())
	}
}

func TestNoCollateralRefused(t *testing.T) {
	pki := newTestPKI(t)
	other := bytes.Repeat([]byte{0xab}, 48)
	tests := map[string]struct {
		body      func(*tdxpb.TDQuoteBody)
		qe        func(*tdxpb.EnclaveReport) // before sealing: the PCK key signs it
		afterSeal func(*tdxpb.QuoteV4)
		roots     bool // trust Intel's root, not the PKI's
		policy    func(*Policy)
		wantErr   error
		wantField string
	}{
		"genuine": {},
		"another enclave's signer, certified by the PCK key": {
			qe: func(r *tdxpb.EnclaveReport) { r.MrSigner = bytes.Repeat([]byte{0x11}, 32) }, wantErr: ErrNotIntelEnclave,
		},
		"another product of Intel's signer": {
			qe: func(r *tdxpb.EnclaveReport) { r.IsvProdId = 1 }, wantErr: ErrNotIntelEnclave,
		},
		"a debug QE": {
			qe: func(r *tdxpb.EnclaveReport) { r.Attributes[0] |= 0x02 }, wantErr: ErrNotIntelEnclave,
		},
		"a TDX module Intel did not sign": {
			body: func(b *tdxpb.TDQuoteBody) { b.MrSignerSeam[0] = 1 }, wantErr: ErrNotIntelEnclave,
		},
		"the test PKI under Intel's root":      {roots: true, wantErr: ErrUntrustedRoot},
		"TD report body changed after sealing": {afterSeal: func(q *tdxpb.QuoteV4) { q.TdQuoteBody.Rtmrs[1][0] ^= 1 }, wantErr: ErrSignature},
		"report data of another session": {
			body: func(b *tdxpb.TDQuoteBody) { b.ReportData = tee.ReportData([]byte("another nonce"), []byte("key")) }, wantErr: ErrNotBound,
		},
		"MRTD differs from the policy": {policy: func(p *Policy) { p.MRTD.Expected = other }, wantField: "mrtd"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q := parseQuote(t, realQuoteRaw(t))
			if tc.body != nil {
				tc.body(q.GetTdQuoteBody())
			}
			if tc.qe != nil {
				tc.qe(q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReport())
			}
			q = pki.Seal(t, q)
			if tc.afterSeal != nil {
				tc.afterSeal(q)
			}
			cfg := Config{Policy: realPolicy(t), SkipCollateral: true, Now: fixedClock(realTime), TrustedRoots: pki.Roots()}
			if tc.roots {
				cfg.TrustedRoots = nil
			}
			if tc.policy != nil {
				tc.policy(&cfg.Policy)
			}
			v, err := NewVerifier(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.VerifyQuote(context.Background(), q, mustHex(t, realReportData))
			t.Log(err)
			switch {
			case tc.wantField != "":
				if got := mismatches(err); strings.Join(got, ",") != tc.wantField {
					t.Fatalf("VerifyQuote() = %v, want a mismatch of %s", err, tc.wantField)
				}
			case tc.wantErr == nil && err != nil:
				t.Fatalf("VerifyQuote() = %v", err)
			case !errors.Is(err, tc.wantErr):
				t.Fatalf("VerifyQuote() = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// TestIntelIdentitiesMatchCollateral checks the identities a verifier
// without collateral holds a quote to against Intel's own collateral of
// two platforms, two years apart, and both real quotes against them.
func TestIntelIdentitiesMatchCollateral(t *testing.T) {
	type qeIdentity struct {
		ID             string `json:"id"`
		MiscSelect     string `json:"miscselect"`
		MiscSelectMask string `json:"miscselectMask"`
		Attributes     string `json:"attributes"`
		AttributesMask string `json:"attributesMask"`
		MRSigner       string `json:"mrsigner"`
		ISVProdID      uint32 `json:"isvprodid"`
	}
	type tdxModule struct {
		MRSigner       string `json:"mrsigner"`
		Attributes     string `json:"attributes"`
		AttributesMask string `json:"attributesMask"`
	}
	var june2023 struct {
		EnclaveIdentity qeIdentity `json:"enclaveIdentity"`
	}
	var june2023TCB struct {
		TCBInfo struct {
			TDXModule tdxModule `json:"tdxModule"`
		} `json:"tcbInfo"`
	}
	real := realCollateral(t)
	if err := json.Unmarshal(real["qe-identity.json"], &june2023); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(real["tcb-info-50806f000000.json"], &june2023TCB); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("testdata/dcap-qvl/tdx_quote_collateral.json")
	if err != nil {
		t.Fatal(err)
	}
	var june2025 struct {
		QEIdentity string `json:"qe_identity"`
		TCBInfo    string `json:"tcb_info"`
	}
	if err := json.Unmarshal(raw, &june2025); err != nil {
		t.Fatal(err)
	}
	var qe2025 qeIdentity
	var tcb2025 struct {
		TDXModule tdxModule `json:"tdxModule"`
	}
	if err := json.Unmarshal([]byte(june2025.QEIdentity), &qe2025); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(june2025.TCBInfo), &tcb2025); err != nil {
		t.Fatal(err)
	}
	lower := func(b []byte) string { return hex.EncodeToString(b) }
	for name, qe := range map[string]qeIdentity{"2023": june2023.EnclaveIdentity, "2025": qe2025} {
		if qe.ID != "TD_QE" || strings.ToLower(qe.MRSigner) != lower(intelQEMRSigner) || qe.ISVProdID != intelQEProductID ||
			strings.ToLower(qe.Attributes) != lower(intelQEAttributes) || strings.ToLower(qe.AttributesMask) != lower(intelQEAttributesMask) ||
			qe.MiscSelect != "00000000" || qe.MiscSelectMask != "FFFFFFFF" {
			t.Errorf("QE identity of %s: %+v, which the constants do not match", name, qe)
		}
	}
	for name, m := range map[string]tdxModule{"2023": june2023TCB.TCBInfo.TDXModule, "2025": tcb2025.TDXModule} {
		if m.MRSigner != strings.Repeat("0", 96) || m.Attributes != "0000000000000000" || m.AttributesMask != "FFFFFFFFFFFFFFFF" {
			t.Errorf("TDX module identity of %s: %+v, which the constants do not match", name, m)
		}
	}
	for name, raw := range map[string][]byte{"SPR": realQuoteRaw(t), "EMR": upToDateQuoteRaw(t)} {
		if err := checkIntelIdentities(parseQuote(t, raw)); err != nil {
			t.Errorf("real %s quote: %v", name, err)
		}
	}
}

// TestPeerPolicy checks which registers a TD holds a peer of its own
// image to: a peer of another machine shape (RTMR0) or that extended
// RTMR3 at run time passes, one of other firmware (MRTD) or another boot
// chain (RTMR1, RTMR2) does not.
func TestPeerPolicy(t *testing.T) {
	pki := newTestPKI(t)
	own := parseQuote(t, realQuoteRaw(t)).GetTdQuoteBody()
	var m Measurements
	m.MRTD = own.GetMrTd()
	copy(m.RTMR[:], own.GetRtmrs())
	p := PeerPolicy(m)
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.RTMR[0] != nil || p.RTMR[3] != nil || p.MRSEAM != nil || p.TDAttributes != nil {
		t.Errorf("the peer policy pins more than MRTD, RTMR1 and RTMR2: %+v", p)
	}
	for name, tc := range map[string]struct {
		body      func(*tdxpb.TDQuoteBody)
		wantField string
	}{
		"the same image":                {},
		"another machine shape (RTMR0)": {body: func(b *tdxpb.TDQuoteBody) { b.Rtmrs[0][0] ^= 1 }},
		"extended at run time (RTMR3)":  {body: func(b *tdxpb.TDQuoteBody) { b.Rtmrs[3][0] ^= 1 }},
		"other firmware (MRTD)":         {body: func(b *tdxpb.TDQuoteBody) { b.MrTd[0] ^= 1 }, wantField: "mrtd"},
		"another boot loader (RTMR1)":   {body: func(b *tdxpb.TDQuoteBody) { b.Rtmrs[1][0] ^= 1 }, wantField: "rtmr1"},
		"another initrd or UKI (RTMR2)": {body: func(b *tdxpb.TDQuoteBody) { b.Rtmrs[2][0] ^= 1 }, wantField: "rtmr2"},
	} {
		t.Run(name, func(t *testing.T) {
			v, err := NewVerifier(Config{Policy: p, SkipCollateral: true, Now: fixedClock(realTime), TrustedRoots: pki.Roots()})
			if err != nil {
				t.Fatal(err)
			}
			q := parseQuote(t, realQuoteRaw(t))
			if tc.body != nil {
				tc.body(q.GetTdQuoteBody())
			}
			_, err = v.VerifyQuote(context.Background(), pki.Seal(t, q), mustHex(t, realReportData))
			if got := strings.Join(mismatches(err), ","); got != tc.wantField || tc.wantField == "" && err != nil {
				t.Fatalf("VerifyQuote() = %v, want a mismatch of %q", err, tc.wantField)
			}
		})
	}
}
