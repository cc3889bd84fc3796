package tdx

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/verify"
	attestpb "github.com/google/go-tpm-tools/proto/attest"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// The real evidence is a production quote from a Sapphire Rapids machine
// with Intel's collateral of June 2023 (see testdata/README.md). Its
// platform is below every TCB level of that TCB info (its TEE TCB SVN
// 03000400... is under the 03000500... of the lowest level, and so is
// its PCK certificate's CPU SVN), so go-tdx-guest refuses it at the very
// last step, the TCB status. That refusal, rather than any other, shows
// that everything before it passed on real data: the quote and QE report
// signatures, the PCK chain to Intel's root, both real CRLs, and the
// signatures and validity of the real TCB info and QE identity. The
// tests in resigned_test.go carry the same TD report body through to
// acceptance under a test PKI; uptodate_test.go verifies another real
// quote, whose platform is up to date, end to end.

func TestRealQuoteFields(t *testing.T) {
	q := parseQuote(t, realQuoteRaw(t))
	b := q.GetTdQuoteBody()
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"MRTD", b.GetMrTd(), realMRTD},
		{"RTMR0", b.GetRtmrs()[0], realRTMR0},
		{"RTMR1", b.GetRtmrs()[1], realRTMR1},
		{"RTMR2", b.GetRtmrs()[2], realRTMR2},
		{"RTMR3", b.GetRtmrs()[3], realRTMR3},
		{"MRSEAM", b.GetMrSeam(), realMRSEAM},
		{"TD attributes", b.GetTdAttributes(), realTDAttrs},
		{"TEE TCB SVN", b.GetTeeTcbSvn(), realTEETCBSVN},
		{"report data", b.GetReportData(), realReportData},
		{"MRTD at its raw offset", realQuoteRaw(t)[offMRTD : offMRTD+48], realMRTD},
	} {
		if got := hex.EncodeToString(c.got); got != c.want {
			t.Errorf("%s = %s, want %s", c.name, got, c.want)
		}
	}
}

// TestEmbeddedRootIsIntels checks that the root this package trusts by
// default is the one the real quote's chain ends in.
func TestEmbeddedRootIsIntels(t *testing.T) {
	chain, err := verify.ExtractChainFromQuote(parseQuote(t, realQuoteRaw(t)))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(chain.RootCertificate)
	v, err := NewVerifier(Config{Policy: realPolicy(t), Collateral: CollateralMap{}})
	if err != nil {
		t.Fatal(err)
	}
	if !v.roots.Equal(pool) {
		t.Error("the embedded root is not the real quote's Intel SGX Root CA")
	}
}

// realEvidenceCase changes the real evidence or the verifier's
// configuration, and says how verification must fail.
type realEvidenceCase struct {
	mutate     func(raw []byte)
	collateral func(CollateralMap)
	config     func(*Config)
	wantErr    error
	wantText   []string
}

func realEvidenceCases(t *testing.T) map[string]realEvidenceCase {
	flip := func(off int) func([]byte) {
		return func(raw []byte) { raw[off] ^= 0x01 }
	}
	without := func(name string) func(CollateralMap) {
		return func(m CollateralMap) { delete(m, name) }
	}
	return map[string]realEvidenceCase{
		"unchanged: refused for its TCB, after every other check": {
			wantErr: ErrTCBNotUpToDate, wantText: []string{"no matching TCB level found"},
		},
		"unchanged, revocation not checked": {
			collateral: without("pck-crl-platform.der"),
			config:     func(c *Config) { c.SkipRevocationCheck = true },
			wantErr:    ErrTCBNotUpToDate,
		},
		"TD report body bit flipped":  {mutate: flip(offMRTD), wantErr: ErrSignature},
		"debug attribute set":         {mutate: flip(offTDAttributes), wantErr: ErrSignature},
		"report data changed":         {mutate: flip(offReportData), wantErr: ErrSignature},
		"quote signature bit flipped": {mutate: flip(offSignature + 5), wantErr: ErrSignature},
		"QE report bit flipped":       {mutate: flip(offQEReport + 0x40), wantErr: ErrSignature},
		"PCK chain from another root": {
			config:  func(c *Config) { c.TrustedRoots = freshRoot(t) },
			wantErr: ErrUntrustedRoot,
		},
		"after the PCK certificate expired": {
			config:  func(c *Config) { c.Now = fixedClock(time.Date(2029, time.September, 21, 0, 0, 0, 0, time.UTC)) },
			wantErr: ErrCertificateExpired, wantText: []string{"2029-09-20"},
		},
		"before the PCK certificate was valid": {
			config:  func(c *Config) { c.Now = fixedClock(time.Date(2022, time.September, 1, 0, 0, 0, 0, time.UTC)) },
			wantErr: ErrCertificateExpired,
		},
		"after the collateral's next update": {
			config:  func(c *Config) { c.Now = fixedClock(time.Date(2023, time.August, 1, 0, 0, 0, 0, time.UTC)) },
			wantErr: ErrCollateralExpired,
		},
		"TCB info changed": {
			collateral: func(m CollateralMap) {
				m["tcb-info-50806f000000.json"] = bytes.Replace(m["tcb-info-50806f000000.json"], []byte(`"tcbEvaluationDataNumber":15`), []byte(`"tcbEvaluationDataNumber":16`), 1)
			},
			wantErr: ErrCollateralInvalid,
		},
		"TCB info under the PCK CRL's issuer chain": {
			collateral: func(m CollateralMap) {
				m["tcb-info-50806f000000.issuer-chain.pem"] = m["pck-crl-platform.issuer-chain.pem"]
			},
			wantErr: ErrCollateralInvalid,
		},
		"no TCB info in the cache": {
			collateral: without("tcb-info-50806f000000.json"), wantErr: ErrCollateralMissing,
			wantText: []string{"tcb-info-50806f000000.json", "https://api.trustedservices.intel.com/tdx/certification/v4/tcb?fmspc=50806f000000"},
		},
		"no TCB info issuer chain in the cache": {
			collateral: without("tcb-info-50806f000000.issuer-chain.pem"), wantErr: ErrCollateralMissing,
			wantText: []string{"tcb-info-50806f000000.issuer-chain.pem", "TCB-Info-Issuer-Chain header"},
		},
		"no QE identity in the cache": {
			collateral: without("qe-identity.json"), wantErr: ErrCollateralMissing,
			wantText: []string{"qe-identity.json", "https://api.trustedservices.intel.com/tdx/certification/v4/qe/identity"},
		},
		"no PCK CRL in the cache": {
			collateral: without("pck-crl-platform.der"), wantErr: ErrCollateralMissing,
			wantText: []string{"pck-crl-platform.der", "pckcrl?ca=platform&encoding=der"},
		},
		"no root CA CRL in the cache": {
			collateral: without("root-ca-crl.der"), wantErr: ErrCollateralMissing,
			wantText: []string{"root-ca-crl.der", "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"},
		},
	}
}

func TestRealEvidence(t *testing.T) {
	for name, tc := range realEvidenceCases(t) {
		t.Run(name, func(t *testing.T) {
			raw := realQuoteRaw(t)
			if tc.mutate != nil {
				tc.mutate(raw)
			}
			coll := realCollateral(t)
			if tc.collateral != nil {
				tc.collateral(coll)
			}
			cfg := Config{Policy: realPolicy(t), Collateral: coll, Now: fixedClock(realTime)}
			if tc.config != nil {
				tc.config(&cfg)
			}
			v, err := NewVerifier(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.VerifyQuote(context.Background(), parseQuote(t, raw), mustHex(t, realReportData))
			t.Log(err)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("VerifyQuote() = %v, want %v", err, tc.wantErr)
			}
			for _, s := range tc.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestRealVerifyTEE(t *testing.T) {
	v, err := NewVerifier(Config{Policy: realPolicy(t), Collateral: realCollateral(t), Now: fixedClock(realTime)})
	if err != nil {
		t.Fatal(err)
	}
	rd := mustHex(t, realReportData)
	if _, err := v.VerifyTEE(context.Background(), &attestpb.Attestation{}, rd); !errors.Is(err, ErrNoEvidence) {
		t.Errorf("VerifyTEE(no TDX quote) = %v, want %v", err, ErrNoEvidence)
	}
	att := &attestpb.Attestation{TeeAttestation: &attestpb.Attestation_TdxAttestation{TdxAttestation: parseQuote(t, realQuoteRaw(t))}}
	if _, err := v.VerifyTEE(context.Background(), att, rd); !errors.Is(err, ErrTCBNotUpToDate) {
		t.Errorf("VerifyTEE(real quote) = %v, want %v", err, ErrTCBNotUpToDate)
	}
	if _, err := v.VerifyTEE(context.Background(), att, rd[:32]); err == nil {
		t.Error("VerifyTEE accepted 32 bytes of report data")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.VerifyTEE(ctx, att, rd); !errors.Is(err, context.Canceled) {
		t.Errorf("VerifyTEE(cancelled) = %v, want %v", err, context.Canceled)
	}
}

// TestRealQuotePolicy runs the checks after go-tdx-guest's verification
// on the real quote itself: its own values pass, the session's report
// data must match.
func TestRealQuotePolicy(t *testing.T) {
	q := parseQuote(t, realQuoteRaw(t))
	v, err := NewVerifier(Config{Policy: realPolicy(t), Collateral: CollateralMap{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBase(q, mustHex(t, realReportData)); err != nil {
		t.Errorf("checkBase(own report data) = %v", err)
	}
	if err := v.checkPolicy(q); err != nil {
		t.Errorf("checkPolicy(own values) = %v", err)
	}
	if err := checkBase(q, tee.ReportData([]byte("nonce"), []byte("key"))); !errors.Is(err, ErrNotBound) {
		t.Errorf("checkBase(other session) = %v, want %v", err, ErrNotBound)
	}
}

// freshRoot is a CA that signed nothing in the evidence.
func freshRoot(t *testing.T) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Intel SGX Root CA"},
		NotBefore: realTime.AddDate(-10, 0, 0), NotAfter: realTime.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool
}

func TestParseQuote(t *testing.T) {
	raw := realQuoteRaw(t)
	q, err := ParseQuote(raw)
	if err != nil || hex.EncodeToString(q.GetTdQuoteBody().GetMrTd()) != realMRTD {
		t.Fatalf("ParseQuote(real quote) = %v, %v", q, err)
	}
	// A quote whose signed data claims fewer bytes than its own fixed
	// fields: go-tdx-guest's parser panics on it.
	short := bytes.Clone(raw)
	binary.LittleEndian.PutUint32(short[offSignature-4:], 0x30)
	for name, in := range map[string][]byte{"empty": nil, "truncated": raw[:0x3fb], "signed data size too small": short} {
		if _, err := ParseQuote(in); err == nil {
			t.Errorf("ParseQuote(%s) accepted it", name)
		}
	}
}
