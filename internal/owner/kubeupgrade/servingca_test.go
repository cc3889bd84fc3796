package kubeupgrade

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/records/servingca"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// globalAddress is an address of this machine that the API server
// proxies to (it refuses loopback for a node); the test skips without one.
func globalAddress(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP
		}
	}
	t.Skip("this machine has no global unicast IPv4 address to serve a kubelet on")
	return nil
}

// fakeKubelet answers /healthz over TLS with the certificate it holds.
type fakeKubelet struct {
	mu   sync.Mutex
	cert tls.Certificate
	port int
}

func (k *fakeKubelet) set(c tls.Certificate) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cert = c
}

func serveKubelet(t *testing.T, ip net.IP, cert tls.Certificate) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{cert: cert}
	lis, err := tls.Listen("tcp", net.JoinHostPort(ip.String(), "0"), &tls.Config{MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			k.mu.Lock()
			defer k.mu.Unlock()
			return &k.cert, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	k.port = lis.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return k
}

// servingCert is a kubelet serving certificate for ip from the CA of
// caPEM and caKey.
func servingCert(t *testing.T, ca *x509.Certificate, caKey crypto.Signer, ip net.IP) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "system:node:n"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{ip},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func parsePair(t *testing.T, certPEM, keyPEM []byte) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key.(crypto.Signer)
}

// registerNode makes Node name, whose kubelet the API server reaches at
// ip and port.
func registerNode(t *testing.T, client kubernetes.Interface, name string, ip net.IP, port int, controlPlane bool) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if controlPlane {
		n.Labels[controlPlaneLabel] = ""
	}
	n, err := client.CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port) //nolint:gosec // a port
	if _, err := client.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// movingNode stands for a node's upgrade service: a control plane's move
// records the pair; a renewal gives the kubelet a certificate of the pair.
type movingNode struct {
	mu      *sync.Mutex
	calls   *[]string
	name    string
	kubelet *fakeKubelet
	ip      net.IP
	t       *testing.T
}

func (m movingNode) MoveKubeletServingCA(_ context.Context, certPEM, keyPEM []byte) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.calls = append(*m.calls, "move "+m.name)
	if err := servingca.Check(certPEM, keyPEM, time.Now()); err != nil {
		m.t.Errorf("%s was given no pair: %v", m.name, err)
	}
	return []string{"kube-apiserver", "kube-controller-manager"}, nil
}

func (m movingNode) RenewKubeletServingCertificate(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.calls = append(*m.calls, "renew "+m.name)
	return nil
}

func (m movingNode) Close() error { return nil }

// The API server of a moved control plane does not reach a kubelet whose
// serving certificate the cluster CA signed, so 'kubectl logs' and 'exec'
// fail there, until the kubelet has one of the kubelet-serving CA; the
// move has every control plane take the one pair, then every kubelet
// renew, and waits until the API server reaches each.
func TestMoveServingCAGivesBackLogsAndExec(t *testing.T) {
	ip := globalAddress(t)
	certPEM, keyPEM, err := servingca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "kubelet-serving-ca.crt")
	if err := os.WriteFile(caFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := apiservertest.StartWithKubeletCA(t, caFile)
	client := kubernetes.NewForConfigOrDie(srv.Config)
	servingCA, servingKey := parsePair(t, certPEM, keyPEM)
	otherPEM, otherKeyPEM, err := servingca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	clusterCA, clusterKey := parsePair(t, otherPEM, otherKeyPEM)

	var mu sync.Mutex
	var calls []string
	kubelets := map[string]*fakeKubelet{}
	state := State{}
	for _, n := range []struct {
		name string
		cp   bool
	}{{"cp-0", true}, {"cp-1", true}, {"worker-0", false}} {
		k := serveKubelet(t, ip, servingCert(t, clusterCA, clusterKey, ip))
		kubelets[n.name] = k
		registerNode(t, client, n.name, ip, k.port, n.cp)
		node := Node{Name: n.name, ControlPlane: n.cp, Address: ip.String()}
		if n.cp {
			node.KubeletCA = "/etc/kubernetes/pki/ca.crt"
		}
		state.Nodes = append(state.Nodes, node)
	}
	if err := KubeletReached(t.Context(), client, "worker-0"); err == nil {
		t.Fatal("the API server reached a kubelet whose certificate the cluster CA signed")
	}

	pairs := 0
	cfg := MoveConfig{
		Client: client, NodeTimeout: time.Minute, ServeWait: time.Minute, Say: t.Logf,
		Pair: func() ([]byte, []byte, error) { pairs++; return certPEM, keyPEM, nil },
		Connect: func(_ context.Context, n Node) (ServingCAClient, error) {
			return renewingNode{movingNode{mu: &mu, calls: &calls, name: n.Name, kubelet: kubelets[n.Name], ip: ip, t: t}, servingCA, servingKey}, nil
		},
	}
	if err := MoveServingCA(t.Context(), cfg, state); err != nil {
		t.Fatal(err)
	}
	if pairs != 1 {
		t.Errorf("the pair was asked for %d times, want once", pairs)
	}
	slices.Sort(calls)
	if want := []string{"move cp-0", "move cp-1", "renew cp-0", "renew cp-1", "renew worker-0"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	for name := range kubelets {
		if err := KubeletReached(t.Context(), client, name); err != nil {
			t.Errorf("after the move the API server does not reach %s: %v", name, err)
		}
	}

	// Moved, and every kubelet reached: a second run does nothing.
	calls = nil
	for i := range state.Nodes {
		if state.Nodes[i].ControlPlane {
			state.Nodes[i].KubeletCA = ServingCAFile
		}
	}
	if err := MoveServingCA(t.Context(), cfg, state); err != nil || len(calls) != 0 {
		t.Errorf("a second move: calls %v, %v; want none", calls, err)
	}
}

// renewingNode is a movingNode whose renewal gives its kubelet a
// certificate of the kubelet-serving CA.
type renewingNode struct {
	movingNode
	ca  *x509.Certificate
	key crypto.Signer
}

func (r renewingNode) RenewKubeletServingCertificate(ctx context.Context) error {
	r.kubelet.set(servingCert(r.t, r.ca, r.key, r.ip))
	return r.movingNode.RenewKubeletServingCertificate(ctx)
}
