package kubeadm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/servingca"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// The controller manager that kubeadm's configuration makes signs a
// kubelet's serving certificate with the kubelet-serving CA, and a
// kubelet's client certificate with the cluster CA; the API server's
// clients, who trust the cluster CA, refuse the serving certificate even
// where it names the control plane's address. Real kubeadm renders the
// flags, a real controller manager signs, a real API server holds the
// requests.
func TestKubeletServingCertificatesComeFromTheirOwnCA(t *testing.T) {
	tool := staticPodTool(t)
	p := cp0
	p.KubeletServingCA = true
	pods, err := tool.StaticPods(context.Background(), p, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	apiserver, kcm := podFlags(t, pods["kube-apiserver"]), podFlags(t, pods["kube-controller-manager"])
	if got := apiserver["kubelet-certificate-authority"]; got != filepath.Join(CertificatesDir, KubeletServingCACert) {
		t.Fatalf("the API server checks kubelets against %q, want the kubelet-serving CA alone", got)
	}

	clusterCA, clusterKey := testCA(t, "cluster-ca")
	srv := apiservertest.StartWithCA(t, clusterCA, clusterKey)
	pki := t.TempDir()
	writePEM(t, filepath.Join(pki, "ca.crt"), "CERTIFICATE", clusterCA.Raw)
	keyDER, err := x509.MarshalPKCS8PrivateKey(clusterKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(pki, "ca.key"), "PRIVATE KEY", keyDER)
	if err := EnsureKubeletServingCA(pki, time.Now()); err != nil {
		t.Fatal(err)
	}
	var args []string
	for name, value := range kcm {
		if strings.HasPrefix(name, "cluster-signing-") {
			args = append(args, "--"+name+"="+strings.Replace(value, CertificatesDir, pki, 1))
		}
	}
	srv.ControllerManager(t, append(args, "--controllers=csrsigning")...)

	admin := kubernetes.NewForConfigOrDie(srv.Config)
	const endpoint = "10.42.1.100"
	servingKey, serving := signed(t, admin, "serving", certv1.KubeletServingSignerName, endpoint)
	_, client := signed(t, admin, "client", certv1.KubeAPIServerClientKubeletSignerName, "")

	servingCA := readPEMCert(t, filepath.Join(pki, KubeletServingCACert))
	if err := verify(serving, servingCA, x509.ExtKeyUsageServerAuth); err != nil {
		t.Errorf("the serving certificate is not the kubelet-serving CA's: %v", err)
	}
	if err := verify(serving, clusterCA, x509.ExtKeyUsageAny); err == nil {
		t.Error("the cluster CA issued the kubelet's serving certificate")
	}
	if err := verify(client, clusterCA, x509.ExtKeyUsageClientAuth); err != nil {
		t.Errorf("the client certificate is not the cluster CA's: %v", err)
	}
	if life := serving.NotAfter.Sub(serving.NotBefore); life > admitted.ServingCertLifetime+10*time.Minute {
		t.Errorf("the serving certificate lives %s, want at most %s", life, admitted.ServingCertLifetime)
	}

	// Whoever holds the serving certificate and its key answers at the
	// endpoint's address; a client of the API server does not take it.
	cert := tls.Certificate{Certificate: [][]byte{serving.Raw}, PrivateKey: servingKey}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() { _ = http.Serve(lis, http.NotFoundHandler()) }()
	cfg := rest.CopyConfig(srv.Config)
	cfg.Host = "https://" + lis.Addr().String()
	cfg.ServerName = endpoint
	_, err = kubernetes.NewForConfigOrDie(cfg).Discovery().ServerVersion()
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("a client of the API server, talking to a kubelet-serving certificate for %s: %v, want an unknown authority", endpoint, err)
	}
}

// signed submits a request to signer for a new key (a kubelet's serving
// certificate for ip, or a client certificate), approves it, and returns
// the key and the certificate the controller manager signed.
func signed(t *testing.T, c kubernetes.Interface, name, signer, ip string) (crypto.Signer, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:cp-0", Organization: []string{"system:nodes"}}}
	usages := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}
	if ip != "" {
		tmpl.IPAddresses = []net.IP{net.ParseIP(ip)}
		usages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	seconds := int32(admitted.ServingCertLifetime / time.Second)
	ctx := context.Background()
	csr, err := c.CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: signer, Usages: usages, ExpirationSeconds: &seconds},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("submit %s: %v", name, err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"})
	if _, err := c.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("approve %s: %v", name, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := c.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(got.Status.Certificate) > 0 {
			b, _ := pem.Decode(got.Status.Certificate)
			if b == nil {
				t.Fatalf("%s: the signed certificate is not PEM", name)
			}
			cert, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			return key, cert
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == certv1.CertificateFailed {
				t.Fatalf("the controller manager failed to sign %s: %s", name, cond.Message)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the controller manager did not sign %s in a minute", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func verify(cert, ca *x509.Certificate, usage x509.ExtKeyUsage) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	_, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// podFlags are the --name=value flags of a static pod's one container.
func podFlags(t *testing.T, manifest []byte) map[string]string {
	t.Helper()
	var pod struct {
		Spec podSpec `json:"spec"`
	}
	if err := yaml.Unmarshal(manifest, &pod); err != nil || len(pod.Spec.Containers) != 1 {
		t.Fatalf("not a static pod of one container: %v", err)
	}
	flags := map[string]string{}
	for _, a := range pod.Spec.Containers[0].Command[1:] {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		flags[name] = value
	}
	return flags
}

func testCA(t *testing.T, name string) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readPEMCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// A control plane's static pods are written again at each boot from the
// settings its kept pods were made with: a cluster made before the
// kubelet-serving CA keeps the cluster CA for kubelets (its control
// planes have no kubelet-serving CA to name), a newer one keeps its own.
func TestKeptSettingsSayWhichCASignsKubelets(t *testing.T) {
	tool := staticPodTool(t)
	for _, own := range []bool{false, true} {
		p := cp0
		p.KubeletServingCA = own
		pods, err := tool.StaticPods(context.Background(), p, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		kept := t.TempDir()
		writePods(t, kept, pods)
		got, err := KeptSettings(kept)
		if err != nil || got.KubeletServingCA != own {
			t.Fatalf("KeptSettings of pods made with KubeletServingCA %v: %v, %v", own, got.KubeletServingCA, err)
		}
		planted := bytes.Replace(pods["kube-apiserver"], []byte("--kubelet-certificate-authority="), []byte("--kubelet-certificate-authority=/tmp/x"), 1)
		writePods(t, kept, map[string][]byte{"kube-apiserver": planted})
		if _, err := KeptSettings(kept); !errors.Is(err, ErrKeptSettings) || !strings.Contains(err.Error(), "checks kubelets against") {
			t.Fatalf("KeptSettings of an API server that checks kubelets against another CA: %v, want ErrKeptSettings", err)
		}
	}
}

// EnsureKubeletServingCA makes a pair once and keeps it; it refuses to
// replace a pair that is there but wrong, and replaces a key whose
// certificate was never written.
func TestEnsureKubeletServingCA(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	if err := EnsureKubeletServingCA(dir, now); err != nil {
		t.Fatal(err)
	}
	first := readPEMCert(t, filepath.Join(dir, KubeletServingCACert))
	if err := EnsureKubeletServingCA(dir, now); err != nil {
		t.Fatal(err)
	}
	if again := readPEMCert(t, filepath.Join(dir, KubeletServingCACert)); !again.Equal(first) {
		t.Fatal("a second call made a new CA")
	}
	if st, err := os.Stat(filepath.Join(dir, KubeletServingCAKey)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the key's mode: %v, %v", st, err)
	}

	other := t.TempDir()
	if err := EnsureKubeletServingCA(other, now); err != nil {
		t.Fatal(err)
	}
	swapped, _ := os.ReadFile(filepath.Join(other, KubeletServingCAKey))
	if err := os.WriteFile(filepath.Join(dir, KubeletServingCAKey), swapped, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := EnsureKubeletServingCA(dir, now); err == nil || !strings.Contains(err.Error(), "the key is not the certificate's") {
		t.Fatalf("a key of another CA: %v, want a refusal", err)
	}
	if err := os.WriteFile(filepath.Join(dir, KubeletServingCACert), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := EnsureKubeletServingCA(dir, now); err == nil || !strings.Contains(err.Error(), "remove both files") {
		t.Fatalf("a certificate that is not PEM: %v, want a refusal", err)
	}
	if err := EnsureKubeletServingCA(other, now.Add(11*365*24*time.Hour)); err == nil || !strings.Contains(err.Error(), "not valid now") {
		t.Fatalf("a pair long expired: %v, want a refusal", err)
	}

	cut := t.TempDir()
	if err := EnsureKubeletServingCA(cut, now); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(cut, KubeletServingCACert))
	if err := EnsureKubeletServingCA(cut, now); err != nil {
		t.Fatalf("a key without its certificate (a write cut short): %v, want a new pair", err)
	}
	readPEMCert(t, filepath.Join(cut, KubeletServingCACert))
}

// A control plane moved to the kubelet-serving CA takes the pair it is
// given, takes it again, and refuses another pair or one that is no pair.
func TestInstallKubeletServingCA(t *testing.T) {
	now := time.Now()
	cert, key, err := servingca.New(now)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pki")
	if err := InstallKubeletServingCA(dir, cert, key, now); err != nil {
		t.Fatal(err)
	}
	if err := InstallKubeletServingCA(dir, cert, key, now); err != nil {
		t.Fatalf("the same pair again (a move resumed): %v", err)
	}
	if st, err := os.Stat(filepath.Join(dir, KubeletServingCAKey)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the key's mode: %v, %v", st, err)
	}
	otherCert, otherKey, err := servingca.New(now)
	if err != nil {
		t.Fatal(err)
	}
	if err := InstallKubeletServingCA(dir, otherCert, otherKey, now); !errors.Is(err, ErrOtherKubeletServingCA) {
		t.Fatalf("another pair: %v, want ErrOtherKubeletServingCA", err)
	}
	if err := InstallKubeletServingCA(t.TempDir(), cert, otherKey, now); !errors.Is(err, servingca.ErrInvalid) || strings.Contains(err.Error(), string(otherKey)) {
		t.Fatalf("a certificate with another's key: %v, want servingca.ErrInvalid without the key", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, KubeletServingCACert)); !bytes.Equal(got, cert) {
		t.Fatal("a refused pair replaced the one kept")
	}
}
