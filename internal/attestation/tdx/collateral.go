package tdx

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	"github.com/google/go-tdx-guest/verify/trust"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// Collateral answers go-tdx-guest's requests for Intel PCS URLs with the
// response's headers and body, as trust.HTTPSGetter does. CollateralDir
// and CollateralMap serve the owner's offline cache (see the package
// doc); trust.DefaultHTTPSGetter() would fetch from Intel instead.
type Collateral interface {
	Get(url string) (header map[string][]string, body []byte, err error)
}

// ErrCollateralMissing is what the cache returns for a URL it has no
// file for. Its message names the file and the URL to fetch it from.
var ErrCollateralMissing = errors.New("TDX collateral missing from the cache")

// intelRootCRLURL is where the CRL of Intel's SGX Root CA is published:
// the CRL distribution point of the root certificate.
const intelRootCRLURL = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"

// CollateralDir is a cache directory laid out as the package doc says.
type CollateralDir string

// Get implements Collateral.
func (d CollateralDir) Get(url string) (map[string][]string, []byte, error) {
	return serve(url, func(name string) ([]byte, error) {
		return tee.ReadCollateralFile(filepath.Join(string(d), name))
	})
}

// CollateralMap is an in-memory cache: the same files as CollateralDir,
// by file name.
type CollateralMap map[string][]byte

// Get implements Collateral.
func (m CollateralMap) Get(url string) (map[string][]string, []byte, error) {
	return serve(url, func(name string) ([]byte, error) {
		if b, ok := m[name]; ok {
			return b, nil
		}
		return nil, fs.ErrNotExist
	})
}

// cacheEntry is where the cache keeps one PCS response.
type cacheEntry struct {
	what  string // what the response is, for errors
	body  string // file holding the body
	chain string // file holding the issuer chain header, if any
	// header is the name of the header carrying the issuer chain, as
	// go-tdx-guest looks it up and as Intel spells it.
	header, intelHeader string
}

// entryFor maps a URL that go-tdx-guest asks for to its files.
func entryFor(rawURL string) (cacheEntry, bool) {
	if fmspc, ok := strings.CutPrefix(rawURL, pcs.TcbInfoURL("")); ok {
		if b, err := hex.DecodeString(fmspc); err != nil || len(b) != 6 || fmspc != strings.ToLower(fmspc) {
			return cacheEntry{}, false
		}
		name := "tcb-info-" + fmspc
		return cacheEntry{"TDX TCB info for FMSPC " + fmspc, name + ".json", name + ".issuer-chain.pem", pcs.TcbInfoIssuerChainPhrase, "TCB-Info-Issuer-Chain"}, true
	}
	if name, ok := strings.CutPrefix(rawURL, launchendorsement.TDXURLPrefix); ok {
		mrtd, ok := strings.CutSuffix(name, ".binarypb")
		if b, err := hex.DecodeString(mrtd); !ok || err != nil || len(b) != abi.MrTdSize || mrtd != strings.ToLower(mrtd) {
			return cacheEntry{}, false
		}
		return cacheEntry{what: "Google's launch endorsement of the firmware with MRTD " + mrtd, body: "gce-tdx-endorsement-" + mrtd + ".binarypb"}, true
	}
	switch rawURL {
	case pcs.QeIdentityURL():
		return cacheEntry{"TDX QE identity", "qe-identity.json", "qe-identity.issuer-chain.pem", pcs.SgxQeIdentityIssuerChainPhrase, "SGX-Enclave-Identity-Issuer-Chain"}, true
	case intelRootCRLURL:
		return cacheEntry{what: "Intel SGX Root CA CRL", body: "root-ca-crl.der"}, true
	}
	for _, ca := range []string{"platform", "processor"} {
		if rawURL == pcs.PckCrlURL(ca) {
			name := "pck-crl-" + ca
			return cacheEntry{"PCK CRL of the " + ca + " CA", name + ".der", name + ".issuer-chain.pem", pcs.SgxPckCrlIssuerChainPhrase, "SGX-PCK-CRL-Issuer-Chain"}, true
		}
	}
	return cacheEntry{}, false
}

// serve answers a request for rawURL from the files read returns.
func serve(rawURL string, read func(name string) ([]byte, error)) (map[string][]string, []byte, error) {
	e, ok := entryFor(rawURL)
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s is not Intel PCS collateral that the cache holds", ErrCollateralMissing, rawURL)
	}
	body, err := readEntry(rawURL, e, e.body, read)
	if err != nil {
		return nil, nil, err
	}
	if e.chain == "" {
		return nil, body, nil
	}
	chain, err := readEntry(rawURL, e, e.chain, read)
	if err != nil {
		return nil, nil, err
	}
	// Intel sends the chain URL-encoded, and go-tdx-guest decodes it.
	return map[string][]string{e.header: {url.QueryEscape(string(chain))}}, body, nil
}

func readEntry(rawURL string, e cacheEntry, name string, read func(string) ([]byte, error)) ([]byte, error) {
	b, err := read(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: no %s for the %s: %s", ErrCollateralMissing, name, e.what, fetchHint(rawURL, e))
	}
	if err != nil {
		return nil, fmt.Errorf("read %s from the TDX collateral cache: %w", name, err)
	}
	return b, nil
}

func fetchHint(rawURL string, e cacheEntry) string {
	if e.chain == "" {
		return fmt.Sprintf("download %s and save it as %s", rawURL, e.body)
	}
	return fmt.Sprintf("download %s from Intel PCS, save its body as %s and its %s header, URL-decoded, as %s", rawURL, e.body, e.intelHeader, e.chain)
}

// recordingGetter is what go-tdx-guest fetches through. go-tdx-guest
// reports a fetch failure as text (it wraps with %v); this keeps the
// cache's own error, which says what to fetch, for the caller.
type recordingGetter struct {
	src  Collateral
	miss error
}

func (g *recordingGetter) Get(url string) (map[string][]string, []byte, error) {
	return g.GetContext(context.Background(), url)
}

// GetContext passes the context on to a Collateral that takes one.
func (g *recordingGetter) GetContext(ctx context.Context, url string) (map[string][]string, []byte, error) {
	h, b, err := trust.GetWith(ctx, g.src, url)
	if err != nil && g.miss == nil {
		g.miss = err
	}
	return h, b, err
}
