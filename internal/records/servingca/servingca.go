// Package servingca is the kubelet-serving CA's key pair: the CA with
// which the controller manager signs kubelets' serving certificates
// (signer kubernetes.io/kubelet-serving) and nothing else, and against
// which alone the API server checks a kubelet it connects to. Nothing
// else trusts it: kubeconfigs, kubelets, pods and join tickets hold the
// cluster CA. So a serving certificate approved by mistake lets its holder
// pose as that kubelet to the API server, never as the API server to
// anyone.
//
// A control plane's bootstrapperd makes the pair at init; the owner's
// orrery makes it when it moves a cluster made before the CA to it, and
// hands the same pair to every control plane. This package makes and
// checks it; where it lives is kubeadm's certificate directory
// (controlplanes.KubeletServingCAFiles).
package servingca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// CommonName names the CA in its certificate, and in every serving
// certificate's issuer.
const CommonName = "orrery-kubelet-serving-ca"

// lifetime is the CA's own life, as long as kubeadm's cluster CA (ten
// years): it is replaced with the cluster.
const lifetime = 10 * 365 * 24 * time.Hour

// MaxPEM bounds either file of the pair: a P-256 certificate or key is
// under 1 KiB in PEM.
const MaxPEM = 16 << 10

// New makes a pair valid from now, both PEM. ECDSA P-256, as kubeadm
// makes the cluster's other keys (its encryptionAlgorithm).
func New(now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: CommonName},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// ErrInvalid wraps every reason Check refuses a pair for.
var ErrInvalid = errors.New("not a kubelet-serving CA pair")

// Check says whether certPEM and keyPEM are a CA certificate valid at now
// and its ECDSA key. The error never holds the key.
func Check(certPEM, keyPEM []byte, now time.Time) error {
	if len(certPEM) > MaxPEM || len(keyPEM) > MaxPEM {
		return fmt.Errorf("%w: a file of the pair is over %d bytes", ErrInvalid, MaxPEM)
	}
	cert, err := parsePEM(certPEM, "CERTIFICATE", x509.ParseCertificate)
	if err != nil {
		return fmt.Errorf("%w: the certificate: %w", ErrInvalid, err)
	}
	key, err := parsePEM(keyPEM, "PRIVATE KEY", x509.ParsePKCS8PrivateKey)
	if err != nil {
		// x509's errors say what failed to parse, not the key's bytes.
		return fmt.Errorf("%w: the key: %w", ErrInvalid, err)
	}
	signer, ok := key.(*ecdsa.PrivateKey)
	if !ok || !signer.PublicKey.Equal(cert.PublicKey) {
		return fmt.Errorf("%w: the key is not the certificate's", ErrInvalid)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("%w: the certificate is no CA's", ErrInvalid)
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return fmt.Errorf("%w: the certificate is not valid now (valid %s to %s)", ErrInvalid, cert.NotBefore.Format(time.RFC3339), cert.NotAfter.Format(time.RFC3339))
	}
	return nil
}

func parsePEM[T any](data []byte, typ string, parse func([]byte) (T, error)) (T, error) {
	var zero T
	b, rest := pem.Decode(data)
	if b == nil || b.Type != typ || len(bytes.TrimSpace(rest)) != 0 {
		return zero, fmt.Errorf("not one PEM %s block", typ)
	}
	return parse(b.Bytes)
}
