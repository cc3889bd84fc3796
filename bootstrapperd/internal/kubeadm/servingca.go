package kubeadm

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
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/internal/atomicfile"
)

// CertificatesDir is kubeadm's certificate directory on a node.
const CertificatesDir = "/etc/kubernetes/pki"

// The kubelet-serving CA's files, in CertificatesDir. The controller
// manager signs kubelets' serving certificates (signer
// kubernetes.io/kubelet-serving) with this key pair and nothing else, and
// the API server checks kubelets against this certificate alone
// (--kubelet-certificate-authority). Nothing else trusts it: kubeconfigs,
// kubelets, pods and join tickets hold the cluster CA (ca.crt). So a
// serving certificate approved by mistake lets its holder pose as that
// kubelet to the API server, never as the API server to anyone.
const (
	KubeletServingCACert = "kubelet-serving-ca.crt"
	KubeletServingCAKey  = "kubelet-serving-ca.key"
)

// kubeletServingCALifetime is the CA's own life, as long as kubeadm's
// cluster CA (ten years): it is replaced with the cluster.
const kubeletServingCALifetime = 10 * 365 * 24 * time.Hour

// EnsureKubeletServingCA makes the kubelet-serving CA in dir unless a
// valid pair is there already (an init resumed after its files were
// written). It runs before kubeadm init, whose controller manager and API
// server name the files; kubeadm reset removes them with the rest of the
// PKI, so a retried init makes a new pair.
func EnsureKubeletServingCA(dir string, now time.Time) error {
	certPath, keyPath := filepath.Join(dir, KubeletServingCACert), filepath.Join(dir, KubeletServingCAKey)
	switch err := checkKubeletServingCA(certPath, keyPath, now); {
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		// A pair that is there but wrong was not written by this code;
		// replacing it would hide what changed it.
		return fmt.Errorf("kubelet-serving CA in %s: %w (remove both files to have a new pair made)", dir, err)
	}
	certPEM, keyPEM, err := newKubeletServingCA(now)
	if err != nil {
		return fmt.Errorf("make the kubelet-serving CA: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make the kubelet-serving CA: %w", err)
	}
	// The key first: a certificate without its key is what the check
	// above refuses to repair, a key without its certificate is replaced.
	if err := atomicfile.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write the kubelet-serving CA key: %w", err)
	}
	if err := atomicfile.WriteFile(certPath, certPEM, 0o644); err != nil {
		return fmt.Errorf("write the kubelet-serving CA certificate: %w", err)
	}
	return nil
}

// newKubeletServingCA makes the CA's certificate and key, both PEM. ECDSA
// P-256, as kubeadm makes the cluster's other keys here
// (encryptionAlgorithm).
func newKubeletServingCA(now time.Time) (certPEM, keyPEM []byte, err error) {
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
		Subject:               pkix.Name{CommonName: "orrery-kubelet-serving-ca"},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(kubeletServingCALifetime),
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

// checkKubeletServingCA says whether the pair at certPath and keyPath is
// a CA valid at now whose key matches; fs.ErrNotExist if there is no
// certificate, or no key (a write cut between the two).
func checkKubeletServingCA(certPath, keyPath string, now time.Time) error {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return err
	}
	cert, err := parsePEM(certPEM, "CERTIFICATE", x509.ParseCertificate)
	if err != nil {
		return fmt.Errorf("%s: %w", certPath, err)
	}
	key, err := parsePEM(keyPEM, "PRIVATE KEY", x509.ParsePKCS8PrivateKey)
	if err != nil {
		return fmt.Errorf("%s: %w", keyPath, err)
	}
	signer, ok := key.(*ecdsa.PrivateKey)
	if !ok || !signer.PublicKey.Equal(cert.PublicKey) {
		return fmt.Errorf("%s does not hold the key of %s", keyPath, certPath)
	}
	if !cert.IsCA || now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return fmt.Errorf("%s is not a CA valid now (valid %s to %s)", certPath, cert.NotBefore.Format(time.RFC3339), cert.NotAfter.Format(time.RFC3339))
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
