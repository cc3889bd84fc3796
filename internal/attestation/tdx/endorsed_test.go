package tdx

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement/endorsementtest"
)

// endorseMRTD endorses a firmware whose MRTD at 16 GiB is mrtd.
func endorseMRTD(t *testing.T, a *endorsementtest.Authority, mrtd []byte, svn uint32) []byte {
	t.Helper()
	return a.Endorse(t, endorsementtest.Document{
		Signed:     upToDateTime.Add(-time.Hour),
		UEFIDigest: endorsementtest.Digest(0xf0),
		TDX: &launchendorsement.TDX{SVN: svn, Measurements: []launchendorsement.TDXMeasurement{
			{RAMGiB: 8, MRTD: endorsementtest.Digest(0x08)},
			{RAMGiB: 16, MRTD: mrtd},
		}},
	})
}

// TestEndorsedMRTD verifies the real up-to-date quote under a policy that
// takes its MRTD from a launch endorsement in the collateral cache, and
// refuses it when the endorsement is missing, names other MRTDs, is
// signed under another root, or is of a retired build.
func TestEndorsedMRTD(t *testing.T) {
	a := endorsementtest.NewAuthority(t, upToDateTime)
	mrtd := mustHex(t, upToDateMRTD)
	file := "gce-tdx-endorsement-" + upToDateMRTD + ".binarypb"
	tests := map[string]struct {
		endorsement []byte
		minimumSVN  uint32
		want        string // "" accepts
	}{
		"an endorsement of the quote's MRTD": {endorsement: endorseMRTD(t, a, mrtd, 2)},
		"no endorsement in the cache":        {want: "no " + file},
		"an endorsement of other MRTDs":      {endorsement: endorseMRTD(t, a, endorsementtest.Digest(0x16), 2), want: "is none of the 2"},
		"an endorsement under another root": {
			endorsement: endorseMRTD(t, endorsementtest.NewAuthority(t, upToDateTime), mrtd, 2),
			want:        "is not certified by the root the owner named",
		},
		"a retired firmware build": {endorsement: endorseMRTD(t, a, mrtd, 2), minimumSVN: 3, want: "below the owner's minimum 3"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pol := upToDatePolicy(t)
			pol.MRTD = nil
			lp := a.Policy()
			lp.MinimumSVN = tc.minimumSVN
			pol.GCELaunchEndorsement = &lp
			coll := upToDateCollateral(t)
			if tc.endorsement != nil {
				coll[file] = tc.endorsement
			}
			v, err := NewVerifier(Config{Policy: pol, Collateral: coll, Now: fixedClock(upToDateTime)})
			if err != nil {
				t.Fatal(err)
			}
			q, err := ParseQuote(upToDateQuoteRaw(t))
			if err != nil {
				t.Fatal(err)
			}
			fields, err := v.VerifyQuote(context.Background(), q, mustHex(t, upToDateReportData))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("VerifyQuote = %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("quote with an endorsed MRTD refused: %v", err)
			}
			var named bool
			for _, f := range fields {
				named = named || (f.Name == "launch endorsement" && strings.Contains(f.Value, "16 GiB"))
			}
			if !named {
				t.Errorf("fields do not name the endorsement: %v", fields)
			}
		})
	}
}

func TestEndorsementPolicyJSON(t *testing.T) {
	a := endorsementtest.NewAuthority(t, upToDateTime)
	pol := upToDatePolicy(t)
	pol.MRTD = nil
	lp := a.Policy()
	pol.GCELaunchEndorsement = &lp
	text, err := pol.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParsePolicy(text)
	if err != nil {
		t.Fatalf("ParsePolicy(MarshalJSON) = %v", err)
	}
	if back.MRTD != nil || back.GCELaunchEndorsement == nil || back.GCELaunchEndorsement.Roots != a.RootPEM {
		t.Errorf("policy read back = %+v", back)
	}
	pol.MRTD = upToDatePolicy(t).MRTD
	if _, err := pol.MarshalJSON(); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("policy with both an MRTD and endorsements: %v, want a refusal", err)
	}
}
