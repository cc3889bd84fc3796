package snp

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-sev-guest/verify/trust"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// Collateral is the owner's cache of what AMD's Key Distribution Service
// (KDS) serves, CRLs and certificates, and of Google's launch
// endorsements, each by the URL it is published at.
type Collateral interface {
	// Get returns the body KDS serves at url, or an error wrapping
	// fs.ErrNotExist if the cache does not hold it.
	Get(url string) ([]byte, error)
}

// CollateralDir is a cache directory laid out as KDS's URLs are: the
// body of https://kdsintf.amd.com/vcek/v1/Milan/crl is the file
// DIR/kdsintf.amd.com/vcek/v1/Milan/crl, as `wget -x` saves it. A query
// string, if any, is part of the file name after a '@'.
type CollateralDir string

// Get implements Collateral.
func (d CollateralDir) Get(rawURL string) ([]byte, error) {
	path, err := d.path(rawURL)
	if err != nil {
		return nil, err
	}
	return tee.ReadCollateralFile(path)
}

// path is the file that holds the body of rawURL.
func (d CollateralDir) path(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("collateral URL %q is not an https URL", rawURL)
	}
	name := u.Host + u.Path
	if u.RawQuery != "" {
		name += "@" + u.RawQuery
	}
	clean := filepath.Clean(filepath.FromSlash(name))
	if strings.HasPrefix(clean, "..") || filepath.IsAbs(clean) {
		return "", fmt.Errorf("collateral URL %q names a path outside the cache", rawURL)
	}
	return filepath.Join(string(d), clean), nil
}

// CollateralMap is an in-memory cache, by URL.
type CollateralMap map[string][]byte

// Get implements Collateral.
func (m CollateralMap) Get(url string) ([]byte, error) {
	if b, ok := m[url]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("%s: %w", url, fs.ErrNotExist)
}

// ErrCollateralExpired is wrapped by the error for a product CRL past
// its nextUpdate, which names the CRL and says how to replace it.
var ErrCollateralExpired = errors.New("product CRL expired (or this machine's clock is wrong)")

// offlineGetter is what go-sev-guest fetches through: the owner's cache,
// and the trusted roots' own certificate chains (go-sev-guest asks for a
// product's ASK and ARK when the evidence lacks them; the trusted roots
// decide anyway). It never touches the network. It is made for one
// verification, at now.
type offlineGetter struct {
	own   CollateralMap
	cache Collateral
	roots map[string][]*trust.AMDRootCerts
	now   time.Time
	// expired is the error for a CRL refused as past its nextUpdate.
	// go-sev-guest reports a failed fetch as text; this keeps the
	// error, which says what to fetch, for the caller.
	expired error
}

func (g *offlineGetter) Get(url string) ([]byte, error) {
	if b, ok := g.own[url]; ok {
		return g.fresh(url, b, testRootCRLHint)
	}
	for line, roots := range g.roots {
		if url == "https://kdsintf.amd.com/vcek/v1/"+line+"/cert_chain" && len(roots) > 0 {
			pc := roots[0].ProductCerts
			return append(pemCert(pc.Ask.Raw), pemCert(pc.Ark.Raw)...), nil
		}
	}
	if g.cache == nil {
		return nil, fmt.Errorf("%s is not in the collateral cache (none was given): verification uses no network", url)
	}
	b, err := g.cache.Get(url)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s is not in the collateral cache (verification uses no network): %s", url, fetchHint(g.cache, url))
	}
	if err != nil {
		return nil, err
	}
	return g.fresh(url, b, fetchHint(g.cache, url))
}

// fresh returns b unless it is a product CRL past its nextUpdate, which
// is refused with hint, what the owner does to replace it. go-sev-guest
// uses a CRL it fetched whatever its nextUpdate (it only fetches again
// once the CRL it holds is past it), so a stale cache would hide every
// key AMD revoked since. A CRL without a nextUpdate cannot be told fresh
// and is refused too. What does not parse is left to go-sev-guest,
// which refuses it.
func (g *offlineGetter) fresh(url string, b []byte, hint string) ([]byte, error) {
	if !g.isCRL(url) {
		return b, nil
	}
	crl, err := x509.ParseRevocationList(b)
	if err != nil || !g.now.After(crl.NextUpdate) {
		return b, nil
	}
	next := "has no nextUpdate"
	if !crl.NextUpdate.IsZero() {
		next = "has nextUpdate " + crl.NextUpdate.UTC().Format(time.RFC3339)
	}
	err = fmt.Errorf("%w: %s's CRL (%s) %s and it is %s now, so a key AMD revoked since would pass; %s",
		ErrCollateralExpired, issuerName(crl), url, next, g.now.UTC().Format(time.RFC3339), hint)
	if g.expired == nil {
		g.expired = err
	}
	return nil, err
}

// isCRL tells whether url is where a trusted ASK or ASVK says its
// product's CRL is published.
func (g *offlineGetter) isCRL(url string) bool {
	for _, roots := range g.roots {
		for _, r := range roots {
			if r.ProductCerts == nil {
				continue
			}
			for _, c := range []*x509.Certificate{r.ProductCerts.Ask, r.ProductCerts.Asvk} {
				if c != nil && slices.Contains(c.CRLDistributionPoints, url) {
					return true
				}
			}
		}
	}
	return false
}

// issuerName names a CRL by its issuer, AMD's ARK of a product line
// ("ARK-Milan").
func issuerName(crl *x509.RevocationList) string {
	if cn := crl.Issuer.CommonName; cn != "" {
		return cn
	}
	return crl.Issuer.String()
}

// testRootCRLHint is how the owner replaces a test root's CRL, which the
// policy brings rather than the cache.
const testRootCRLHint = "a test root brings its CRL, and the local cloud writes a fresh one each time it starts ('orrery mini up --sev-snp' writes orrery-mini/snp-test-root.json): name that file again with --snp-test-root"

// fetchHint says how to put KDS's body for url into the cache: as a
// command when the cache is a directory. curl -o replaces the file in
// place (wget would save a second copy beside it).
func fetchHint(cache Collateral, url string) string {
	if d, ok := cache.(CollateralDir); ok {
		if path, err := d.path(url); err == nil {
			return fmt.Sprintf("fetch it from AMD's KDS into the collateral cache (--snp-collateral %s): curl -fsS --create-dirs -o %s %s", d, path, url)
		}
	}
	return fmt.Sprintf("fetch %s from AMD's KDS into the collateral cache (--snp-collateral)", url)
}

// fetchEndorsementHint says how to put Google's launch endorsement at url
// into the cache.
func fetchEndorsementHint(cache Collateral, url string) string {
	if d, ok := cache.(CollateralDir); ok {
		if path, err := d.path(url); err == nil {
			return fmt.Sprintf("fetch it from Google into the collateral cache: curl -fsS --create-dirs -o %s %s", path, url)
		}
	}
	return fmt.Sprintf("fetch %s into the collateral cache (--snp-collateral)", url)
}
