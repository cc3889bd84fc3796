// Package endorsementtest signs launch endorsements as Google does, under
// a test root, for the tests of the code that verifies them.
package endorsementtest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"maps"
	"math/big"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
)

// Authority is a test root and a signing key certified by it, shaped as
// Google's: an RSA root that may certify signing keys directly, and an
// RSA signing certificate for digital signatures only.
type Authority struct {
	Root    *x509.Certificate
	RootPEM string
	Signer  *x509.Certificate
	key     *rsa.PrivateKey
	rootKey *rsa.PrivateKey
}

// NewAuthority makes an authority whose root is valid from 10 days before
// now to a year after, and whose signer from a day before now to half a
// year after, so that either can be tested outside its validity alone.
func NewAuthority(t testing.TB, now time.Time) *Authority {
	t.Helper()
	rootKey := newKey(t)
	rootTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test GCE-cc-tcb-root", Organization: []string{"not Google"}},
		NotBefore:             now.Add(-10 * 24 * time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		SignatureAlgorithm:    x509.SHA256WithRSAPSS,
	}
	root := create(t, rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	a := &Authority{
		Root:    root,
		RootPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})),
		rootKey: rootKey,
	}
	return a.WithSigner(t, now, nil)
}

// WithSigner is the authority with a new signing key, whose certificate
// the root issues as Google's after change, if any, edits it.
func (a *Authority) WithSigner(t testing.TB, now time.Time, change func(*x509.Certificate)) *Authority {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "test GCE-cc-tcb-signer", Organization: []string{"not Google"}},
		NotBefore:             now.Add(-24 * time.Hour),
		NotAfter:              now.Add(182 * 24 * time.Hour),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		SignatureAlgorithm:    x509.SHA256WithRSAPSS,
	}
	if change != nil {
		change(tmpl)
	}
	key := newKey(t)
	out := *a
	out.Signer = create(t, tmpl, a.Root, &key.PublicKey, a.rootKey)
	out.key = key
	return &out
}

// Policy trusts the authority's root.
func (a *Authority) Policy() launchendorsement.Policy {
	return launchendorsement.Policy{Roots: a.RootPEM}
}

// Document is what an endorsement states.
type Document struct {
	Signed     time.Time
	UEFIDigest []byte
	SNP        *launchendorsement.SNP
	TDX        *launchendorsement.TDX
	// CABundle is the bundle of CA certificates the document carries;
	// Endorse puts the root there when it is nil, as Google does.
	CABundle []byte
}

// Endorse signs d with the authority's signing key.
func (a *Authority) Endorse(t testing.TB, d Document) []byte {
	t.Helper()
	if d.CABundle == nil {
		d.CABundle = []byte(a.RootPEM)
	}
	golden := Golden(d, a.Signer.Raw)
	return Wrap(golden, a.Sign(t, golden))
}

// Sign signs golden bytes as Google does: RSA-PSS over SHA-256.
func (a *Authority) Sign(t testing.TB, golden []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(golden)
	sig, err := rsa.SignPSS(rand.Reader, a.key, crypto.SHA256, sum[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// Wrap makes a VMLaunchEndorsement of signed golden bytes.
func Wrap(golden, signature []byte) []byte {
	var b []byte
	b = appendBytes(b, 1, golden)
	return appendBytes(b, 2, signature)
}

// Golden serialises a VMGoldenMeasurement naming signerDER.
func Golden(d Document, signerDER []byte) []byte {
	var ts []byte
	ts = appendVarint(ts, 1, uint64(d.Signed.Unix()))
	ts = appendVarint(ts, 2, uint64(d.Signed.Nanosecond()))
	var b []byte
	b = appendBytes(b, 1, ts)
	b = appendVarint(b, 2, 1234)
	b = appendBytes(b, 3, []byte("0123456789abcdef0123456789abcdef01234567"))
	b = appendBytes(b, 4, signerDER)
	b = appendBytes(b, 5, d.UEFIDigest)
	if d.CABundle != nil {
		b = appendBytes(b, 6, d.CABundle)
	}
	if s := d.SNP; s != nil {
		var m []byte
		m = appendVarint(m, 1, uint64(s.SVN))
		for _, vmsas := range slices.Sorted(maps.Keys(s.Measurements)) {
			var entry []byte
			entry = appendVarint(entry, 1, uint64(vmsas))
			entry = appendBytes(entry, 2, s.Measurements[vmsas])
			m = appendBytes(m, 2, entry)
		}
		m = appendBytes(m, 3, s.FamilyID)
		m = appendBytes(m, 4, s.ImageID)
		m = appendVarint(m, 5, s.Policy)
		if s.SVSMMeasurement != nil {
			m = appendBytes(m, 7, s.SVSMMeasurement)
		}
		b = appendBytes(b, 7, m)
	}
	if x := d.TDX; x != nil {
		var m []byte
		m = appendVarint(m, 1, uint64(x.SVN))
		for _, meas := range x.Measurements {
			var entry []byte
			entry = appendVarint(entry, 1, uint64(meas.RAMGiB))
			if meas.EarlyAccept {
				entry = appendVarint(entry, 2, 1)
			}
			entry = appendBytes(entry, 3, meas.MRTD)
			m = appendBytes(m, 2, entry)
		}
		b = appendBytes(b, 8, m)
	}
	return b
}

// Digest is a SHA-384-sized value filled with b, for measurements in
// tests.
func Digest(b byte) []byte {
	d := make([]byte, 48)
	for i := range d {
		d[i] = b
	}
	return d
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// newKey makes a 1024-bit key: the smallest crypto/rsa accepts, and
// several times faster to make than Google's sizes, which tests that make
// a dozen authorities feel.
func newKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func create(t testing.TB, tmpl, parent *x509.Certificate, pub *rsa.PublicKey, key *rsa.PrivateKey) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
