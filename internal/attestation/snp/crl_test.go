package snp_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
)

// week is how long after its thisUpdate a CRL of snpsim's Chip.CRL is
// valid.
const week = 7 * 24 * time.Hour

// expiredCRLIsRefusedCases are TestExpiredCRLIsRefused's cases.
var expiredCRLIsRefusedCases = map[string]struct {
	cfg            snpsim.Config
	change         func(t *testing.T, s *simCase)
	skipRevocation bool
	wantErr        error    // nil: want[] alone decides
	want           []string // nil with wantErr nil: the report passes
}{
	"a fresh CRL": {},
	"a CRL at its nextUpdate": {
		change: func(t *testing.T, s *simCase) { s.crl = crlIssued(t, s.chip, simNow.Add(-week)) },
	},
	"a CRL a second past its nextUpdate": {
		change:  func(t *testing.T, s *simCase) { s.crl = crlIssued(t, s.chip, simNow.Add(-week-time.Second)) },
		wantErr: snp.ErrCollateralExpired,
		want:    []string{"nextUpdate 2026-10-31T23:59:59Z", "it is 2026-11-01T00:00:00Z now"},
	},
	"a CRL a day past its nextUpdate": {
		change:  func(t *testing.T, s *simCase) { s.crl = crlIssued(t, s.chip, simNow.Add(-week-24*time.Hour)) },
		wantErr: snp.ErrCollateralExpired,
		want:    []string{"ARK-Milan's CRL (https://kdsintf.amd.com/vcek/v1/Milan/crl) has nextUpdate 2026-10-31T00:00:00Z", "revoked since"},
	},
	"a revoked VCEK in a fresh CRL": {
		cfg:    snpsim.Config{VCEKSerial: big.NewInt(77)},
		change: func(t *testing.T, s *simCase) { s.crl = crlIssued(t, s.chip, simNow.Add(-time.Hour), big.NewInt(77)) },
		want:   []string{"signing key certificate (serial 77) was revoked by AMD"},
	},
	"a revoked ASK in a fresh CRL": {
		change: func(t *testing.T, s *simCase) {
			s.crl = crlIssued(t, s.chip, simNow.Add(-time.Hour), askSerial(t, s.policy.TestRoot))
		},
		want: []string{"ASK was revoked"},
	},
	"a revoked VCEK in an expired CRL": {
		cfg: snpsim.Config{VCEKSerial: big.NewInt(77)},
		change: func(t *testing.T, s *simCase) {
			s.crl = crlIssued(t, s.chip, simNow.Add(-2*week), big.NewInt(77))
		},
		wantErr: snp.ErrCollateralExpired,
	},
	"an expired CRL, revocation not checked": {
		change:         func(t *testing.T, s *simCase) { s.crl = crlIssued(t, s.chip, simNow.Add(-2*week)) },
		skipRevocation: true,
	},
	"a test root's own CRL past its nextUpdate": {
		change: func(t *testing.T, s *simCase) {
			root := s.chip.TestRoot()
			root.CRL = string(pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: crlIssued(t, s.chip, simNow.Add(-week-24*time.Hour))}))
			s.policy.TestRoot, s.crl = &root, nil
		},
		wantErr: snp.ErrCollateralExpired,
		want:    []string{"has nextUpdate 2026-10-31T00:00:00Z", "'orrery mini up --sev-snp'", "--snp-test-root"},
	},
}

// A product CRL past its nextUpdate is refused, from the owner's cache or
// from a test root, with an error that says which CRL and how to replace
// it: go-sev-guest would use it, and AMD may have revoked keys since. A
// fresh CRL still refuses what it revokes, and nothing changes when the
// owner chose not to check revocation.
func TestExpiredCRLIsRefused(t *testing.T) {
	tests := expiredCRLIsRefusedCases
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newSim(t, tc.cfg)
			if tc.change != nil {
				tc.change(t, s)
			}
			dir := t.TempDir()
			crlFile := filepath.Join(dir, "kdsintf.amd.com", "vcek", "v1", "Milan", "crl")
			if s.crl != nil {
				writeFile(t, crlFile, s.crl)
			}
			v, err := snp.NewVerifier(snp.Config{
				Policy:              s.policy,
				Collateral:          snp.CollateralDir(dir),
				SkipRevocationCheck: tc.skipRevocation,
				Now:                 func() time.Time { return simNow },
			})
			if err != nil {
				t.Fatal(err)
			}
			att, err := s.chip.Report(s.guest, s.data)
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.VerifyReport(context.Background(), att, s.data[:])
			t.Log(err)
			if tc.wantErr == nil && tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("got %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && errors.Is(err, snp.ErrCollateralExpired) {
				t.Errorf("a fresh CRL refused as expired: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
			// From the cache, the error gives the command that replaces
			// the very file.
			fetch := "curl -fsS --create-dirs -o " + crlFile + " " + s.chip.CRLURL()
			if errors.Is(err, snp.ErrCollateralExpired) && s.crl != nil && !strings.Contains(err.Error(), fetch) {
				t.Errorf("the error does not say how to fetch the CRL again (%q): %v", fetch, err)
			}
		})
	}
}

// A verifier that runs for long (the join service's) does not keep
// using a CRL it fetched once it is past its nextUpdate, and takes the
// fresh one the owner puts into the cache without a restart.
func TestLongRunningVerifierRefreshesItsCRL(t *testing.T) {
	s := newSim(t, snpsim.Config{})
	cache := snp.CollateralMap{s.chip.CRLURL(): s.crl}
	now := simNow
	v, err := snp.NewVerifier(snp.Config{Policy: s.policy, Collateral: cache, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	att, err := s.chip.Report(s.guest, s.data)
	if err != nil {
		t.Fatal(err)
	}
	verify := func() error {
		_, err := v.VerifyReport(context.Background(), att, s.data[:])
		return err
	}
	if err := verify(); err != nil {
		t.Fatalf("with a fresh CRL: %v", err)
	}
	now = simNow.Add(2 * week)
	if err := verify(); !errors.Is(err, snp.ErrCollateralExpired) {
		t.Fatalf("a week after the CRL's nextUpdate: got %v, want %v", err, snp.ErrCollateralExpired)
	}
	cache[s.chip.CRLURL()] = crlIssued(t, s.chip, now.Add(-time.Hour))
	if err := verify(); err != nil {
		t.Fatalf("after the owner refreshed the cache: %v", err)
	}
}

// crlIssued is a CRL of chip's ARK issued at thisUpdate, valid for a
// week.
func crlIssued(t *testing.T, chip *snpsim.Chip, thisUpdate time.Time, revoked ...*big.Int) []byte {
	t.Helper()
	crl, err := chip.CRL(thisUpdate, revoked...)
	if err != nil {
		t.Fatal(err)
	}
	return crl
}

func askSerial(t *testing.T, root *snp.TestRoot) *big.Int {
	t.Helper()
	block, _ := pem.Decode([]byte(root.ASK))
	if block == nil {
		t.Fatal("the test root has no ASK")
	}
	ask, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return ask.SerialNumber
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
