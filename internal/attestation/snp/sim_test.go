package snp_test

import (
	"context"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	test "github.com/google/go-sev-guest/testing"
	attestpb "github.com/google/go-tpm-tools/proto/attest"

	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

var simNow = time.Date(2026, time.November, 1, 0, 0, 0, 0, time.UTC)

type simCase struct {
	chip   *snpsim.Chip
	guest  snpsim.Guest
	policy snp.Policy
	crl    []byte
	data   [abi.ReportDataSize]byte
	// attached are the host's extra certificate table entries, by GUID.
	attached map[string][]byte
	// cached is more of the owner's collateral, by URL.
	cached snp.CollateralMap
}

func newSim(t *testing.T, cfg snpsim.Config) *simCase {
	t.Helper()
	if cfg.Keys == nil {
		// go-sev-guest's fixed test keys: making RSA-4096 keys per test
		// would take seconds.
		cfg.Keys = test.DefaultAmdKeys()
	}
	if cfg.Now.IsZero() {
		cfg.Now = simNow.Add(-24 * time.Hour)
	}
	if cfg.TCB == (kds.TCBParts{}) {
		cfg.TCB = kds.TCBParts{BlSpl: 4, SnpSpl: 22, UcodeSpl: 213}
	}
	cfg.ChipID[0] = 0xc1
	chip, err := snpsim.NewChip(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crl, err := chip.CRL(simNow.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var guest snpsim.Guest
	guest.Measurement[0] = 0x4d
	guest.Policy = abi.SnpPolicy{SMT: true}
	root := chip.TestRoot()
	s := &simCase{
		chip:  chip,
		guest: guest,
		policy: snp.Policy{
			Measurement: &tee.Expected{Expected: append([]byte(nil), guest.Measurement[:]...)},
			MinimumTCB:  &snp.TCB{Bootloader: 4, SNP: 22, Microcode: 213},
			TestRoot:    &root,
		},
		crl: crl,
	}
	copy(s.data[:], tee.ReportData([]byte("nonce"), []byte("tls key")))
	return s
}

func (s *simCase) verify(t *testing.T) ([]tee.Field, error) {
	t.Helper()
	att, err := s.chip.Report(s.guest, s.data)
	if err != nil {
		t.Fatal(err)
	}
	if s.attached != nil {
		att.CertificateChain.Extras = s.attached
	}
	collateral := snp.CollateralMap{s.chip.CRLURL(): s.crl}
	for url, b := range s.cached {
		collateral[url] = b
	}
	v, err := snp.NewVerifier(snp.Config{
		Policy:     s.policy,
		Collateral: collateral,
		Now:        func() time.Time { return simNow },
	})
	if err != nil {
		return nil, err
	}
	return v.VerifyTEE(context.Background(), &attestpb.Attestation{
		TeeAttestation: &attestpb.Attestation_SevSnpAttestation{SevSnpAttestation: att},
	}, s.data[:])
}

func TestSimulatedReportVerifiesUnderItsTestRoot(t *testing.T) {
	fields, err := newSim(t, snpsim.Config{}).verify(t)
	if err != nil {
		t.Fatalf("simulated report refused: %v", err)
	}
	var warned bool
	for _, f := range fields {
		warned = warned || (f.Name == "warning" && strings.Contains(f.Value, "test root"))
	}
	if !warned {
		t.Errorf("fields of a test-root report do not say so: %v", fields)
	}
}

func TestSimulatedReportRefusals(t *testing.T) {
	tests := map[string]struct {
		cfg    snpsim.Config
		change func(*simCase)
		want   string
	}{
		"AMD's roots, when the policy names no test root": {
			change: func(s *simCase) { s.policy.TestRoot = nil },
			want:   "could not be verified by any trusted roots",
		},
		"a test root the owner did not call not a real CPU": {
			change: func(s *simCase) { s.policy.TestRoot.NotARealCPU = false },
			want:   `"notARealCpu": true`,
		},
		"a debug guest": {
			change: func(s *simCase) { s.guest.Policy.Debug = true },
			want:   "guest policy debug is allowed",
		},
		"an older TCB": {
			cfg:  snpsim.Config{TCB: kds.TCBParts{BlSpl: 4, SnpSpl: 21, UcodeSpl: 213}},
			want: "reported TCB is bootloader 4, tee 0, snp 21, microcode 213, but the policy wants at least bootloader 4, tee 0, snp 22",
		},
		"a migration agent": {
			change: func(s *simCase) { s.guest.Policy.MigrateMA = true },
			want:   "guest policy is",
		},
		"another launch measurement": {
			change: func(s *simCase) { s.guest.Measurement[1] = 1 },
			want:   "measurement is 4d01",
		},
		"a revoked VCEK": {
			cfg: snpsim.Config{VCEKSerial: big.NewInt(77)},
			change: func(s *simCase) {
				s.crl = mustCRL(t, s.chip, big.NewInt(77))
			},
			want: "revoked",
		},
		"a CRL missing from the collateral cache": {
			change: func(s *simCase) { s.crl = nil },
			want:   "no usable CRL",
		},
		"a CRL not signed by the ARK": {
			change: func(s *simCase) { s.crl = mustCRL(t, newSim(t, snpsim.Config{Keys: otherKeys(t)}).chip) },
			want:   "CRL is not signed by ARK",
		},
		"an expired VCEK": {
			cfg:  snpsim.Config{Now: simNow.AddDate(-8, 0, 0)},
			want: "expired",
		},
		"report data of another session": {
			change: func(s *simCase) { s.data[0] ^= 1 },
			want:   "does not bind this session",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newSim(t, tc.cfg)
			if tc.change != nil {
				tc.change(s)
			}
			if strings.Contains(name, "another session") {
				// The report is made for the right session, checked
				// against another.
				att, err := s.chip.Report(s.guest, s.data)
				if err != nil {
					t.Fatal(err)
				}
				err = verifyAgainst(t, s, att, tee.ReportData([]byte("other nonce"), []byte("tls key")))
				assertRefused(t, err, tc.want)
				return
			}
			_, err := s.verify(t)
			assertRefused(t, err, tc.want)
		})
	}
}

func verifyAgainst(t *testing.T, s *simCase, att *spb.Attestation, data []byte) error {
	v, err := snp.NewVerifier(snp.Config{Policy: s.policy, Collateral: snp.CollateralMap{s.chip.CRLURL(): s.crl}, Now: func() time.Time { return simNow }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.VerifyReport(context.Background(), att, data)
	return err
}

func assertRefused(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want an error containing %q", err, want)
	}
}

func mustCRL(t *testing.T, chip *snpsim.Chip, revoked ...*big.Int) []byte {
	t.Helper()
	crl, err := chip.CRL(simNow.Add(-time.Hour), revoked...)
	if err != nil {
		t.Fatal(err)
	}
	return crl
}

func otherKeys(t *testing.T) *test.AmdKeys {
	t.Helper()
	k, err := snpsim.NewKeys()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestAttestationWithoutSNPEvidenceIsRefused(t *testing.T) {
	s := newSim(t, snpsim.Config{})
	v, err := snp.NewVerifier(snp.Config{Policy: s.policy})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.VerifyTEE(context.Background(), &attestpb.Attestation{}, s.data[:])
	if err == nil || !strings.Contains(err.Error(), "no SEV-SNP report") {
		t.Fatalf("got %v", err)
	}
	var m *tee.Mismatch
	if errors.As(err, &m) {
		t.Fatal("a missing report is not a field mismatch")
	}
}

// A test root brings its own CRL: no collateral cache is needed, and a
// CRL that the root's ARK did not sign is refused when the policy is.
func TestTestRootBringsItsCRL(t *testing.T) {
	s := newSim(t, snpsim.Config{})
	root, err := s.chip.TestRootWithCRL(simNow.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	s.policy.TestRoot = &root
	att, err := s.chip.Report(s.guest, s.data)
	if err != nil {
		t.Fatal(err)
	}
	v, err := snp.NewVerifier(snp.Config{Policy: s.policy, Now: func() time.Time { return simNow }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.VerifyReport(context.Background(), att, s.data[:]); err != nil {
		t.Fatalf("a report under a test root with its CRL refused: %v", err)
	}
	other, err := newSim(t, snpsim.Config{Keys: otherKeys(t)}).chip.TestRootWithCRL(simNow)
	if err != nil {
		t.Fatal(err)
	}
	root.CRL = other.CRL
	if err := s.policy.Validate(); err == nil || !strings.Contains(err.Error(), "testRoot.crl is not signed by testRoot.ark") {
		t.Fatalf("a test root with another root's CRL: %v", err)
	}
}
