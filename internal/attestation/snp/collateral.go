package snp

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-sev-guest/verify/trust"
)

// Collateral is the owner's cache of what AMD's Key Distribution Service
// (KDS) serves: CRLs and certificates, by their KDS URL.
type Collateral interface {
	// Get returns the body KDS serves at url, or an error wrapping
	// fs.ErrNotExist if the cache does not hold it.
	Get(url string) ([]byte, error)
}

// maxCollateralFile bounds what is read from the cache: KDS's CRLs and
// certificates are a few kilobytes.
const maxCollateralFile = 1 << 20

// CollateralDir is a cache directory laid out as KDS's URLs are: the
// body of https://kdsintf.amd.com/vcek/v1/Milan/crl is the file
// DIR/kdsintf.amd.com/vcek/v1/Milan/crl, as `wget -x` saves it. A query
// string, if any, is part of the file name after a '@'.
type CollateralDir string

// Get implements Collateral.
func (d CollateralDir) Get(rawURL string) ([]byte, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("collateral URL %q is not an https URL", rawURL)
	}
	name := u.Host + u.Path
	if u.RawQuery != "" {
		name += "@" + u.RawQuery
	}
	clean := filepath.Clean(filepath.FromSlash(name))
	if strings.HasPrefix(clean, "..") || filepath.IsAbs(clean) {
		return nil, fmt.Errorf("collateral URL %q names a path outside the cache", rawURL)
	}
	path := filepath.Join(string(d), clean)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCollateralFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxCollateralFile {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a KDS response", path, maxCollateralFile)
	}
	return b, nil
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

// offlineGetter is what go-sev-guest fetches through: the owner's cache,
// and the trusted roots' own certificate chains (go-sev-guest asks for a
// product's ASK and ARK when the evidence lacks them; the trusted roots
// decide anyway). It never touches the network.
type offlineGetter struct {
	own   CollateralMap
	cache Collateral
	roots map[string][]*trust.AMDRootCerts
}

func (g offlineGetter) Get(url string) ([]byte, error) {
	if b, ok := g.own[url]; ok {
		return b, nil
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
		return nil, fmt.Errorf("%s is not in the collateral cache: fetch it from AMD's KDS into the cache (verification uses no network)", url)
	}
	return b, err
}
