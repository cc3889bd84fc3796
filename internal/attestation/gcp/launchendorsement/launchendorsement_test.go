package launchendorsement_test

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement/endorsementtest"
)

var now = time.Date(2026, time.November, 1, 0, 0, 0, 0, time.UTC)

// document endorses a firmware for SEV-SNP at 2, 4 and 8 vCPUs and for
// TDX at 8 and 16 GiB.
func document() endorsementtest.Document {
	return endorsementtest.Document{
		Signed:     now.Add(-48 * time.Hour),
		UEFIDigest: endorsementtest.Digest(0xf0),
		SNP: &launchendorsement.SNP{
			SVN: 3,
			Measurements: map[uint32][]byte{
				2: endorsementtest.Digest(0x02),
				4: endorsementtest.Digest(0x04),
				8: endorsementtest.Digest(0x08),
			},
			Policy:   0x30000,
			FamilyID: bytes.Repeat([]byte{0xfa}, 16),
			ImageID:  bytes.Repeat([]byte{0x1d}, 16),
		},
		TDX: &launchendorsement.TDX{SVN: 2, Measurements: []launchendorsement.TDXMeasurement{
			{RAMGiB: 8, MRTD: endorsementtest.Digest(0x88)},
			{RAMGiB: 16, EarlyAccept: true, MRTD: endorsementtest.Digest(0x16)},
		}},
	}
}

// TestACABundleIsNotRead accepts an endorsement whose CA bundle is not
// PEM: Google's root certifies the signer directly, and Google does not
// promise the bundle's format.
func TestACABundleIsNotRead(t *testing.T) {
	a := endorsementtest.NewAuthority(t, now)
	d := document()
	d.CABundle = []byte("\x30\x82 DER or anything")
	if _, err := a.Policy().CheckSNP(a.Endorse(t, d), endorsementtest.Digest(0x02), now); err != nil {
		t.Fatalf("endorsement with a CA bundle that is not PEM refused: %v", err)
	}
}

func TestEndorsedMeasurementsAreAccepted(t *testing.T) {
	a := endorsementtest.NewAuthority(t, now)
	blob := a.Endorse(t, document())
	p := a.Policy()
	p.MinimumSVN = 2

	snp, err := p.CheckSNP(blob, endorsementtest.Digest(0x04), now)
	if err != nil {
		t.Fatalf("endorsed SEV-SNP measurement refused: %v", err)
	}
	if snp.LaunchVMSAs != 4 || !bytes.Equal(snp.Golden.UEFIDigest, endorsementtest.Digest(0xf0)) || !snp.Golden.Signed.Equal(now.Add(-48*time.Hour)) {
		t.Errorf("SEV-SNP launch = %d VMSAs, UEFI %x, signed %s", snp.LaunchVMSAs, snp.Golden.UEFIDigest, snp.Golden.Signed)
	}
	if d := snp.Describe(); !strings.Contains(d, "4 VMSAs") || !strings.Contains(d, "svn 3") || !strings.Contains(d, "f0f0f0") {
		t.Errorf("description %q lacks the vCPUs, the svn or the firmware", d)
	}

	tdx, err := p.CheckTDX(blob, endorsementtest.Digest(0x16), now)
	if err != nil {
		t.Fatalf("endorsed MRTD refused: %v", err)
	}
	if tdx.Config.RAMGiB != 16 || !tdx.Config.EarlyAccept {
		t.Errorf("TDX configuration = %+v, want 16 GiB with early accept", tdx.Config)
	}
}

// refusal is an endorsement check that must fail: the blob (a good
// endorsement if nil), checked for measurement (the 4-VMSA one if nil) at
// at (now if zero) under the authority's policy after change.
type refusal struct {
	blob        []byte
	policy      func(*launchendorsement.Policy)
	measurement []byte
	at          time.Time
	want        string
}

func TestRefusals(t *testing.T) {
	a := endorsementtest.NewAuthority(t, now)
	good := a.Endorse(t, document())
	for name, tc := range refusals(t, a, good) {
		t.Run(name, func(t *testing.T) {
			blob := good
			if tc.blob != nil {
				blob = tc.blob
			}
			p := a.Policy()
			p.MinimumSVN = 3
			if tc.policy != nil {
				tc.policy(&p)
			}
			m := endorsementtest.Digest(0x04)
			if tc.measurement != nil {
				m = tc.measurement
			}
			at := now
			if !tc.at.IsZero() {
				at = tc.at
			}
			_, err := p.CheckSNP(blob, m, at)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckSNP = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func refusals(t *testing.T, a *endorsementtest.Authority, good []byte) map[string]refusal {
	out := signerRefusals(t, a)
	maps.Copy(out, documentRefusals(t, a, good))
	return out
}

// signerRefusals are endorsements whose signature or signer is wrong.
func signerRefusals(t *testing.T, a *endorsementtest.Authority) map[string]refusal {
	other := endorsementtest.NewAuthority(t, now)
	golden := endorsementtest.Golden(document(), a.Signer.Raw)
	return map[string]refusal{
		"a root other than the one that signed": {
			policy: func(p *launchendorsement.Policy) { p.Roots = other.RootPEM },
			want:   "is not certified by the root the owner named",
		},
		"a golden measurement changed after signing": {
			blob: endorsementtest.Wrap(bytes.Replace(golden, endorsementtest.Digest(0x08), endorsementtest.Digest(0x06), 1), a.Sign(t, golden)),
			want: "does not verify",
		},
		"a signature by another key than the certificate's": {
			blob: endorsementtest.Wrap(golden, other.Sign(t, golden)),
			want: "does not verify",
		},
		"another authority's signer certificate in a document signed by it": {
			blob: func() []byte {
				g := endorsementtest.Golden(document(), other.Signer.Raw)
				return endorsementtest.Wrap(g, other.Sign(t, g))
			}(),
			want: "is not certified by the root the owner named",
		},
		"a signer certificate past its validity, its root still valid": {
			at:   now.Add(200 * 24 * time.Hour),
			want: "expired",
		},
		"a signer certificate not yet valid, its root valid": {
			at:   now.Add(-2 * 24 * time.Hour),
			want: "not yet valid",
		},
		"a signer certificate that is a CA": {
			blob: a.WithSigner(t, now, func(c *x509.Certificate) { c.IsCA = true }).Endorse(t, document()),
			want: "not a document-signing certificate",
		},
		"a signer certificate without digitalSignature": {
			blob: a.WithSigner(t, now, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageCertSign }).Endorse(t, document()),
			want: "not a document-signing certificate",
		},
		"the signing certificate named as the root": {
			policy: func(p *launchendorsement.Policy) { p.Roots = pemOf(a.Signer.Raw) },
			want:   "not a self-signed CA certificate",
		},
		"no root": {
			policy: func(p *launchendorsement.Policy) { p.Roots = "" },
			want:   "holds no certificate",
		},
	}
}

// documentRefusals are endorsements whose content or encoding is wrong.
func documentRefusals(t *testing.T, a *endorsementtest.Authority, good []byte) map[string]refusal {
	return map[string]refusal{
		"a measurement the endorsement does not list": {
			measurement: endorsementtest.Digest(0x06),
			want:        "none of the 3",
		},
		"the MRTD given as an SEV-SNP measurement": {
			measurement: endorsementtest.Digest(0x88),
			want:        "none of the 3",
		},
		"a measurement listed only as the one under an SVSM": {
			blob: a.Endorse(t, func() endorsementtest.Document {
				d := document()
				d.SNP.SVSMMeasurement = endorsementtest.Digest(0x5f)
				return d
			}()),
			measurement: endorsementtest.Digest(0x5f),
			want:        "none of the 3",
		},
		"a security version below the owner's minimum": {
			policy: func(p *launchendorsement.Policy) { p.MinimumSVN = 4 },
			want:   "below the owner's minimum 4",
		},
		"a truncated endorsement": {
			blob: good[:len(good)-10],
			want: "malformed",
		},
		"an empty endorsement": {
			blob: []byte{},
			want: "no golden measurement",
		},
		"garbage": {
			blob: bytes.Repeat([]byte{0xff}, 64),
			want: "malformed",
		},
		"an endorsement larger than any Google's": {
			blob: make([]byte, launchendorsement.MaxSize+1),
			want: "more than the",
		},
		"a signature given twice": {
			blob: protowire.AppendBytes(protowire.AppendTag(good, 2, protowire.BytesType), []byte("second")),
			want: "field 2 is given twice",
		},
		"a golden measurement given as a number": {
			blob: protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7),
			want: "wire type",
		},
	}
}

func TestGoldenMeasurementRefusals(t *testing.T) {
	a := endorsementtest.NewAuthority(t, now)
	tests := map[string]struct {
		change func(*endorsementtest.Document)
		check  func(launchendorsement.Policy, []byte) error
		want   string
	}{
		"an endorsement for TDX only, checked for SEV-SNP": {
			change: func(d *endorsementtest.Document) { d.SNP = nil },
			check: func(p launchendorsement.Policy, b []byte) error {
				_, err := p.CheckSNP(b, endorsementtest.Digest(0x04), now)
				return err
			},
			want: "says nothing about SEV-SNP",
		},
		"an endorsement for SEV-SNP only, checked for TDX": {
			change: func(d *endorsementtest.Document) { d.TDX = nil },
			check: func(p launchendorsement.Policy, b []byte) error {
				_, err := p.CheckTDX(b, endorsementtest.Digest(0x88), now)
				return err
			},
			want: "says nothing about TDX",
		},
		"an endorsement for neither": {
			change: func(d *endorsementtest.Document) { d.SNP, d.TDX = nil, nil },
			want:   "neither SEV-SNP nor TDX",
		},
		"a measurement that is not a SHA-384 digest": {
			change: func(d *endorsementtest.Document) { d.SNP.Measurements[4] = []byte{1, 2, 3} },
			want:   "3 bytes, not the 48",
		},
		"a firmware digest that is not a SHA-384 digest": {
			change: func(d *endorsementtest.Document) { d.UEFIDigest = make([]byte, 32) },
			want:   "32 bytes, not the 48",
		},
		"a measurement for 0 vCPUs": {
			change: func(d *endorsementtest.Document) { d.SNP.Measurements[0] = endorsementtest.Digest(0) },
			want:   "0 VMSAs",
		},
		"a TDX security version below the owner's minimum": {
			check: func(p launchendorsement.Policy, b []byte) error {
				p.MinimumSVN = 3
				_, err := p.CheckTDX(b, endorsementtest.Digest(0x88), now)
				return err
			},
			want: "TDX security version is 2, below",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := document()
			if tc.change != nil {
				tc.change(&d)
			}
			check := tc.check
			if check == nil {
				check = func(p launchendorsement.Policy, b []byte) error {
					_, err := p.CheckSNP(b, endorsementtest.Digest(0x04), now)
					return err
				}
			}
			err := check(a.Policy(), a.Endorse(t, d))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestPolicyJSONIsStrict(t *testing.T) {
	var p launchendorsement.Policy
	if err := json.Unmarshal([]byte(`{"roots": "x", "minimumSvn": 2}`), &p); err != nil || p.MinimumSVN != 2 || p.Roots != "x" {
		t.Fatalf("policy = %+v, %v", p, err)
	}
	for doc, want := range map[string]string{
		`{"minimumSvn": 2}`:                  "roots",
		`{"roots": "x"}`:                     "minimumSvn",
		`{"roots": "x", "minimumSVN": 2}`:    "unknown field",
		`{"roots": "x", "roots": "y"}`:       "roots",
		`{"roots": "x", "minimumSvn": -1}`:   "minimumSvn",
		`{"roots": "x", "minimumSvn": null}`: "minimumSvn",
	} {
		if err := json.Unmarshal([]byte(doc), &p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want one naming %q", doc, err, want)
		}
	}
}

func TestURLsAreGooglesBucketLayout(t *testing.T) {
	m := endorsementtest.Digest(0xab)
	if got, want := launchendorsement.SNPURL(m), "https://storage.googleapis.com/gce_tcb_integrity/ovmf_x64_csm/sevsnp/"+strings.Repeat("ab", 48)+".binarypb"; got != want {
		t.Errorf("SNPURL = %s, want %s", got, want)
	}
	if got, want := launchendorsement.TDXURL(m), "https://storage.googleapis.com/gce_tcb_integrity/ovmf_x64_csm/tdx/"+strings.Repeat("ab", 48)+".binarypb"; got != want {
		t.Errorf("TDXURL = %s, want %s", got, want)
	}
}
