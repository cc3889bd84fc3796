package tdx

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// A second piece of real evidence, which go-tdx-guest accepts in full:
// a TD quote from an Emerald Rapids machine (FMSPC b0c06f000000) and the
// Intel collateral fetched for it in June 2025, both from Phala
// Network's dcap-qvl (testdata/dcap-qvl, see testdata/README.md). Its
// platform is at the top TCB level of that TCB info: PCK CPU SVN
// 03030202040100050000... and PCE SVN 11 against 02020202030100050000...
// and 11, TEE TCB SVN 06010300... against 05000200..., and its TDX module
// (version 1, ISV SVN 6) and QE (ISV SVN 6) are at or above the ISV SVN 4
// that Intel's TDX_01 module identity and QE identity call UpToDate.
// (For a quote whose TEE TCB SVN names a module version, as this one
// does, the TDX TCB status go-tdx-guest reports is the module
// identity's level, not the platform's; here both are UpToDate, of
// 2024-03-13.)

// upToDateTime is inside every validity window of that evidence: the QE
// identity is issued at 2025-06-19 10:32:27 UTC, the latest start, and
// the PCK CRL's next update, 2025-07-19 10:00:35 UTC, is the earliest
// end (TCB info and QE identity follow within 32 minutes, the root CA
// CRL on 2026-04-03; the PCK certificate is valid from 2025-02-06).
var upToDateTime = time.Date(2025, time.July, 1, 0, 0, 0, 0, time.UTC)

// That quote's own fields, which the policy of TestRealQuoteUpToDate
// expects.
const (
	upToDateMRTD       = "91eb2b44d141d4ece09f0c75c2c53d247a3c68edd7fafe8a3520c942a604a407de03ae6dc5f87f27428b2538873118b7"
	upToDateRTMR0      = "44c0197b39157fdd7a4dcc44767f9d6b0bb3977c7a8e347b8492f827fe9d9e5c48aca29b220b80b6a540cf994b9bc9c0"
	upToDateRTMR1      = "0084452c01668329d4bc06acdf58a7205c26743304509973949e5619bf81a6a7aea8c323c173019b3093d54e579e9378"
	upToDateRTMR2      = "d833feef2cd945148aa38ead2c53e9b7f138190aaaebfc551dccd829fc207aa3ba80b70870d7330733642e01d48c3132"
	upToDateRTMR3      = "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
	upToDateMRSEAM     = "5b38e33a6487958b72c3c12a938eaa5e3fd4510c51aeeab58c7d5ecee41d7c436489d6c8e4f92f160b7cad34207b00c1"
	upToDateTDAttrs    = "0000001000000000" // SEPT_VE_DISABLE
	upToDateTEETCBSVN  = "06010300000000000000000000000000"
	upToDateReportData = "9a9d48e7f6799642d3d1b34e1e5e1742d4bb02dd6ddd551862c1211d35c304f9eca3efdbb481601c163cf52493d6e44aed55d51ec39b7e518fadb92c2b523f20"
	upToDateFMSPC      = "b0c06f000000"
)

func upToDateQuoteRaw(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/dcap-qvl/tdx_quote")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// upToDateCollateral lays dcap-qvl's collateral file out as this
// package's cache. That file keeps each PCS response in pieces: the
// TCB info and QE identity objects as the exact text Intel signed, with
// their signatures beside them, and the CRLs in hex. The PCS response
// bodies are rebuilt around that text unchanged (go-tdx-guest verifies
// the signature over those bytes, so a single changed byte would
// fail); the issuer chains are already the URL-decoded headers.
func upToDateCollateral(t testing.TB) CollateralMap {
	t.Helper()
	raw, err := os.ReadFile("testdata/dcap-qvl/tdx_quote_collateral.json")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		PckCrlIssuerChain     string `json:"pck_crl_issuer_chain"`
		RootCaCrl             string `json:"root_ca_crl"`
		PckCrl                string `json:"pck_crl"`
		TcbInfoIssuerChain    string `json:"tcb_info_issuer_chain"`
		TcbInfo               string `json:"tcb_info"`
		TcbInfoSignature      string `json:"tcb_info_signature"`
		QeIdentityIssuerChain string `json:"qe_identity_issuer_chain"`
		QeIdentity            string `json:"qe_identity"`
		QeIdentitySignature   string `json:"qe_identity_signature"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	var tcb struct{ Fmspc string }
	if err := json.Unmarshal([]byte(c.TcbInfo), &tcb); err != nil {
		t.Fatal(err)
	}
	if got := strings.ToLower(tcb.Fmspc); got != upToDateFMSPC {
		t.Fatalf("the collateral's TCB info is for FMSPC %s, not %s", got, upToDateFMSPC)
	}
	tcbName := "tcb-info-" + upToDateFMSPC
	return CollateralMap{
		tcbName + ".json":                   []byte(`{"tcbInfo":` + c.TcbInfo + `,"signature":"` + c.TcbInfoSignature + `"}`),
		tcbName + ".issuer-chain.pem":       []byte(c.TcbInfoIssuerChain),
		"qe-identity.json":                  []byte(`{"enclaveIdentity":` + c.QeIdentity + `,"signature":"` + c.QeIdentitySignature + `"}`),
		"qe-identity.issuer-chain.pem":      []byte(c.QeIdentityIssuerChain),
		"pck-crl-platform.der":              mustHex(t, c.PckCrl),
		"pck-crl-platform.issuer-chain.pem": []byte(c.PckCrlIssuerChain),
		"root-ca-crl.der":                   mustHex(t, c.RootCaCrl),
	}
}

// upToDatePolicy enforces every field of that quote at its own value.
func upToDatePolicy(t testing.TB) Policy {
	exp := func(s string) *tee.Expected { return &tee.Expected{Expected: mustHex(t, s)} }
	return Policy{
		MRTD:             exp(upToDateMRTD),
		RTMR:             [4]*tee.Expected{exp(upToDateRTMR0), exp(upToDateRTMR1), exp(upToDateRTMR2), exp(upToDateRTMR3)},
		MRSEAM:           exp(upToDateMRSEAM),
		TDAttributes:     exp(upToDateTDAttrs),
		MinimumTEETCBSVN: &MinimumSVN{Minimum: mustHex(t, upToDateTEETCBSVN)},
		// The quote's header leaves QE_SVN 0 (its QE report says ISV
		// SVN 6, which the QE identity checks).
		MinimumQESVN: &tee.MinimumVersion{Minimum: 0},
	}
}

// TestRealQuoteUpToDate verifies real evidence end to end, with
// revocation checked: every check of go-tdx-guest passes on Intel's own
// collateral and the TCB status reached is UpToDate.
func TestRealQuoteUpToDate(t *testing.T) {
	v, err := NewVerifier(Config{Policy: upToDatePolicy(t), Collateral: upToDateCollateral(t), Now: fixedClock(upToDateTime)})
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseQuote(upToDateQuoteRaw(t))
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.VerifyQuote(context.Background(), q, mustHex(t, upToDateReportData))
	if err != nil {
		t.Fatalf("VerifyQuote(real quote, its collateral) = %v", err)
	}
	byName := map[string]string{}
	for _, f := range got {
		byName[f.Name] = f.Value
	}
	for name, want := range map[string]string{
		"MRTD":              upToDateMRTD,
		"RTMR2":             upToDateRTMR2,
		"TEE TCB SVN":       upToDateTEETCBSVN,
		"TD attributes":     upToDateTDAttrs + " (SEPT_VE_DISABLE)",
		"TDX TCB status":    "UpToDate, TCB date 2024-03-13T00:00:00Z",
		"QE TCB status":     "UpToDate, TCB date 2024-03-13T00:00:00Z",
		"QE report ISV SVN": "6",
	} {
		if byName[name] != want {
			t.Errorf("field %s = %q, want %q", name, byName[name], want)
		}
	}
}

// TestRealQuoteUpToDateRefusals checks that the same evidence is refused
// when one thing about it is wrong, so that its acceptance above is not
// for want of checking.
func TestRealQuoteUpToDateRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate     func(raw []byte)
		collateral func(CollateralMap)
		config     func(*Config)
		reportData []byte
		wantErr    error // nil: a *tee.Mismatch
	}{
		"without the PCK CRL (so revocation was checked)": {
			collateral: func(m CollateralMap) { delete(m, "pck-crl-platform.der") },
			wantErr:    ErrCollateralMissing,
		},
		"after the PCK CRL's next update": {
			config:  func(c *Config) { c.Now = fixedClock(time.Date(2025, time.July, 19, 10, 0, 36, 0, time.UTC)) },
			wantErr: ErrCollateralExpired,
		},
		"TCB info changed": {
			collateral: func(m CollateralMap) {
				name := "tcb-info-" + upToDateFMSPC + ".json"
				m[name] = []byte(strings.Replace(string(m[name]), `"pcesvn":11`, `"pcesvn":10`, 1))
			},
			wantErr: ErrCollateralInvalid,
		},
		"MRTD bit flipped": {
			mutate:  func(raw []byte) { raw[offMRTD] ^= 0x01 },
			wantErr: ErrSignature,
		},
		"another session's report data": {
			reportData: tee.ReportData([]byte("nonce"), []byte("key")),
			wantErr:    ErrNotBound,
		},
		"policy expects another MRTD": {
			config: func(c *Config) { c.Policy.MRTD = &tee.Expected{Expected: mustHex(t, realMRTD)} },
		},
	} {
		t.Run(name, func(t *testing.T) {
			raw := upToDateQuoteRaw(t)
			if tc.mutate != nil {
				tc.mutate(raw)
			}
			coll := upToDateCollateral(t)
			if tc.collateral != nil {
				tc.collateral(coll)
			}
			cfg := Config{Policy: upToDatePolicy(t), Collateral: coll, Now: fixedClock(upToDateTime)}
			if tc.config != nil {
				tc.config(&cfg)
			}
			v, err := NewVerifier(cfg)
			if err != nil {
				t.Fatal(err)
			}
			rd := tc.reportData
			if rd == nil {
				rd = mustHex(t, upToDateReportData)
			}
			_, err = v.VerifyQuote(context.Background(), parseQuote(t, raw), rd)
			t.Log(err)
			if tc.wantErr == nil {
				var m *tee.Mismatch
				if !errors.As(err, &m) || m.Field != "mrtd" {
					t.Fatalf("VerifyQuote() = %v, want a mismatch of mrtd", err)
				}
			} else if !errors.Is(err, tc.wantErr) {
				t.Fatalf("VerifyQuote() = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// TestRealQuoteUpToDateFields checks the constants above against the
// quote file.
func TestRealQuoteUpToDateFields(t *testing.T) {
	b := parseQuote(t, upToDateQuoteRaw(t)).GetTdQuoteBody()
	for name, c := range map[string]struct {
		got  []byte
		want string
	}{
		"MRTD": {b.GetMrTd(), upToDateMRTD}, "MRSEAM": {b.GetMrSeam(), upToDateMRSEAM},
		"RTMR0": {b.GetRtmrs()[0], upToDateRTMR0}, "RTMR1": {b.GetRtmrs()[1], upToDateRTMR1},
		"RTMR2": {b.GetRtmrs()[2], upToDateRTMR2}, "RTMR3": {b.GetRtmrs()[3], upToDateRTMR3},
		"TD attributes": {b.GetTdAttributes(), upToDateTDAttrs}, "TEE TCB SVN": {b.GetTeeTcbSvn(), upToDateTEETCBSVN},
		"report data": {b.GetReportData(), upToDateReportData},
	} {
		if got := hex.EncodeToString(c.got); got != c.want {
			t.Errorf("%s = %s, want %s", name, got, c.want)
		}
	}
}
