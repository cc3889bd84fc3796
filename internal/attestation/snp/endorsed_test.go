package snp_test

import (
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement/endorsementtest"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// endorsedSim is a simulated report whose policy accepts the launch
// measurements an endorsement authority endorsed, and an endorsement of
// the guest's measurement for 4 vCPUs.
func endorsedSim(t *testing.T) (*simCase, *endorsementtest.Authority, []byte) {
	t.Helper()
	s := newSim(t, snpsim.Config{})
	a := endorsementtest.NewAuthority(t, simNow)
	p := a.Policy()
	s.policy.Measurement = nil
	s.policy.GCELaunchEndorsement = &p
	return s, a, endorse(t, a, s.guest.Measurement[:])
}

func endorse(t *testing.T, a *endorsementtest.Authority, measurement []byte) []byte {
	t.Helper()
	return a.Endorse(t, endorsementtest.Document{
		Signed:     simNow.Add(-time.Hour),
		UEFIDigest: endorsementtest.Digest(0xf0),
		SNP: &launchendorsement.SNP{SVN: 1, Measurements: map[uint32][]byte{
			2: endorsementtest.Digest(0x02),
			4: append([]byte(nil), measurement...),
		}},
	})
}

func TestEndorsedLaunchMeasurement(t *testing.T) {
	for name, place := range map[string]func(*simCase, []byte){
		"attached by the host": func(s *simCase, b []byte) {
			s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: b}
		},
		"in the owner's collateral cache": func(s *simCase, b []byte) {
			s.cached = map[string][]byte{launchendorsement.SNPURL(s.guest.Measurement[:]): b}
		},
		"in the cache, the host's attached one altered": func(s *simCase, b []byte) {
			s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: append([]byte(nil), b[:len(b)-1]...)}
			s.cached = map[string][]byte{launchendorsement.SNPURL(s.guest.Measurement[:]): b}
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, _, blob := endorsedSim(t)
			place(s, blob)
			fields, err := s.verify(t)
			if err != nil {
				t.Fatalf("report with an endorsed measurement refused: %v", err)
			}
			if !hasField(fields, "launch endorsement", "4 VMSAs") {
				t.Errorf("fields do not name the endorsement: %v", fields)
			}
		})
	}
}

func TestEndorsedLaunchRefusals(t *testing.T) {
	tests := map[string]struct {
		change func(s *simCase, a *endorsementtest.Authority, blob []byte)
		want   string
	}{
		"no endorsement anywhere": {
			change: func(*simCase, *endorsementtest.Authority, []byte) {},
			want:   "holds none",
		},
		"the host attaches another firmware's endorsement": {
			change: func(s *simCase, a *endorsementtest.Authority, _ []byte) {
				s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: endorse(t, a, endorsementtest.Digest(0x77))}
			},
			want: "is none of the 2",
		},
		"the host attaches an endorsement under its own root": {
			change: func(s *simCase, _ *endorsementtest.Authority, _ []byte) {
				forger := endorsementtest.NewAuthority(t, simNow)
				s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: endorse(t, forger, s.guest.Measurement[:])}
			},
			want: "is not certified by the root the owner named",
		},
		"the host attaches garbage": {
			change: func(s *simCase, _ *endorsementtest.Authority, _ []byte) {
				s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: []byte("not an endorsement")}
			},
			want: "the launch endorsement the host attached: launch endorsement is malformed",
		},
		"a retired firmware build": {
			change: func(s *simCase, _ *endorsementtest.Authority, blob []byte) {
				s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: blob}
				s.policy.GCELaunchEndorsement.MinimumSVN = 2
			},
			want: "below the owner's minimum 2",
		},
		"an endorsed measurement, but a debug guest": {
			change: func(s *simCase, _ *endorsementtest.Authority, blob []byte) {
				s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: blob}
				s.guest.Policy.Debug = true
			},
			want: "debug",
		},
		"both a fixed measurement and endorsements": {
			change: func(s *simCase, _ *endorsementtest.Authority, blob []byte) {
				s.attached = map[string][]byte{launchendorsement.SNPCertTableGUID: blob}
				s.policy.Measurement = &tee.Expected{Expected: s.guest.Measurement[:]}
			},
			want: "not both",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, a, blob := endorsedSim(t)
			tc.change(s, a, blob)
			_, err := s.verify(t)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("verify = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func hasField(fields []tee.Field, name, part string) bool {
	for _, f := range fields {
		if f.Name == name && strings.Contains(f.Value, part) {
			return true
		}
	}
	return false
}
