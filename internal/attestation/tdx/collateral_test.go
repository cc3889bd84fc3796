package tdx

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/pcs"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

func TestCollateralDir(t *testing.T) {
	dir := CollateralDir("testdata/collateral")
	chainFile, err := os.ReadFile("testdata/collateral/tcb-info-50806f000000.issuer-chain.pem")
	if err != nil {
		t.Fatal(err)
	}
	header, body, err := dir.Get(pcs.TcbInfoURL("50806f000000"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(body, []byte(`"fmspc":"50806f000000"`)) {
		t.Errorf("TCB info body is %.60q...", body)
	}
	// As Intel sends it: URL-encoded, and decoded by go-tdx-guest.
	vals := header[pcs.TcbInfoIssuerChainPhrase]
	if len(vals) != 1 {
		t.Fatalf("header = %v, want one %s", header, pcs.TcbInfoIssuerChainPhrase)
	}
	if got, err := url.QueryUnescape(vals[0]); err != nil || got != string(chainFile) {
		t.Errorf("issuer chain header decodes to %.40q..., %v; want the file", got, err)
	}

	header, body, err = dir.Get(intelRootCRLURL)
	if err != nil || header != nil || len(body) == 0 {
		t.Errorf("Get(root CA CRL) = %v, %d bytes, %v; want a body alone", header, len(body), err)
	}

	for _, u := range []string{
		"https://example.com/tcb",
		pcs.TcbInfoURL("50806F000000"),
		pcs.TcbInfoURL("../../../etc/passwd"),
		pcs.TcbInfoURL("50806f00000"),
		pcs.PckCrlURL("other"),
	} {
		if _, _, err := dir.Get(u); !errors.Is(err, ErrCollateralMissing) || !strings.Contains(err.Error(), "not Intel PCS collateral") {
			t.Errorf("Get(%s) = %v, want a refusal of the URL", u, err)
		}
	}
	if _, _, err := dir.Get(pcs.PckCrlURL("processor")); !errors.Is(err, ErrCollateralMissing) || !strings.Contains(err.Error(), "pck-crl-processor.der") {
		t.Errorf("Get(processor CA's CRL) = %v, want the missing file named", err)
	}
}

func TestCollateralDirRefusesHugeFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "root-ca-crl.der"), make([]byte, tee.MaxCollateralFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := CollateralDir(dir).Get(intelRootCRLURL); err == nil || errors.Is(err, ErrCollateralMissing) {
		t.Errorf("Get(huge file) = %v, want a read error", err)
	}
}

// TestCollateralDirVerifies runs the real evidence against the cache
// directory itself, to show the layout is what go-tdx-guest needs.
func TestCollateralDirVerifies(t *testing.T) {
	v, err := NewVerifier(Config{Policy: realPolicy(t), Collateral: CollateralDir("testdata/collateral"), Now: fixedClock(realTime)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.VerifyQuote(context.Background(), parseQuote(t, realQuoteRaw(t)), mustHex(t, realReportData))
	if !errors.Is(err, ErrTCBNotUpToDate) {
		t.Errorf("VerifyQuote() = %v, want %v (the real platform's only failure)", err, ErrTCBNotUpToDate)
	}
}

func TestNewVerifierNeedsCollateral(t *testing.T) {
	if _, err := NewVerifier(Config{Policy: realPolicy(t)}); err == nil || !strings.Contains(err.Error(), "Collateral") {
		t.Errorf("NewVerifier(no collateral) = %v, want an error naming Config.Collateral", err)
	}
	if _, err := NewVerifier(Config{Collateral: CollateralMap{}}); err == nil || !strings.Contains(err.Error(), "mrtd is missing") {
		t.Errorf("NewVerifier(empty policy) = %v, want the policy refused", err)
	}
}
