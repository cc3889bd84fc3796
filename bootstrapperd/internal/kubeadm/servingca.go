package kubeadm

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/records/servingca"
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

// EnsureKubeletServingCA makes the kubelet-serving CA in dir unless a
// valid pair is there already (an init resumed after its files were
// written). It runs before kubeadm init, whose controller manager and API
// server name the files; kubeadm reset removes them with the rest of the
// PKI, so a retried init makes a new pair.
func EnsureKubeletServingCA(dir string, now time.Time) error {
	switch _, _, err := readKubeletServingCA(dir, now); {
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		// A pair that is there but wrong was not written by this code;
		// replacing it would hide what changed it.
		return fmt.Errorf("kubelet-serving CA in %s: %w (remove both files to have a new pair made)", dir, err)
	}
	certPEM, keyPEM, err := servingca.New(now)
	if err != nil {
		return fmt.Errorf("make the kubelet-serving CA: %w", err)
	}
	return writeKubeletServingCA(dir, certPEM, keyPEM)
}

// ErrOtherKubeletServingCA means a control plane holds a kubelet-serving
// CA other than the one it is given.
var ErrOtherKubeletServingCA = errors.New("this control plane holds another kubelet-serving CA")

// InstallKubeletServingCA puts the pair certPEM and keyPEM in dir, where a
// control plane moved to the kubelet-serving CA keeps it. The same pair
// there already is left as it is; another valid one is refused
// (ErrOtherKubeletServingCA): its controller manager may have signed
// serving certificates with it, which the API servers of the other
// control planes would not take.
func InstallKubeletServingCA(dir string, certPEM, keyPEM []byte, now time.Time) error {
	if err := servingca.Check(certPEM, keyPEM, now); err != nil {
		return err
	}
	haveCert, haveKey, err := readKubeletServingCA(dir, now)
	switch {
	case err == nil && bytes.Equal(haveCert, certPEM) && bytes.Equal(haveKey, keyPEM):
		return nil
	case err == nil:
		return fmt.Errorf("%w in %s", ErrOtherKubeletServingCA, dir)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("kubelet-serving CA in %s: %w (remove both files to have the pair given written)", dir, err)
	}
	return writeKubeletServingCA(dir, certPEM, keyPEM)
}

func writeKubeletServingCA(dir string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write the kubelet-serving CA: %w", err)
	}
	// The key first: a certificate without its key is what the checks
	// above refuse to repair, a key without its certificate is replaced.
	if err := atomicfile.WriteFile(filepath.Join(dir, KubeletServingCAKey), keyPEM, 0o600); err != nil {
		return fmt.Errorf("write the kubelet-serving CA key: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, KubeletServingCACert), certPEM, 0o644); err != nil {
		return fmt.Errorf("write the kubelet-serving CA certificate: %w", err)
	}
	return nil
}

// readKubeletServingCA reads the pair in dir and checks it is a CA valid
// at now and its key; fs.ErrNotExist if there is no certificate, or no
// key (a write cut between the two).
func readKubeletServingCA(dir string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(filepath.Join(dir, KubeletServingCACert)); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = os.ReadFile(filepath.Join(dir, KubeletServingCAKey)); err != nil {
		return nil, nil, err
	}
	if err := servingca.Check(certPEM, keyPEM, now); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}
