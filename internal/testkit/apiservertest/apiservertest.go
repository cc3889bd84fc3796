// Package apiservertest runs a real kube-apiserver with its own etcd for
// tests of code that talks to a cluster (backups, upgrades), the way
// controller-runtime's envtest does: the same binaries the node image
// runs, from the components build (build/components/releases/<default>/imagebin), on
// loopback ports, with an admin client certificate. No controllers, no
// scheduler, no nodes: objects are stored and validated, nothing runs.
// Authorization and admission are a kubeadm cluster's (the Node authorizer
// before RBAC, NodeRestriction, ValidatingAdmissionPolicy), so a test can
// try what a node's or a pod's credentials may do (ConfigAs, TokenFor).
package apiservertest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/orrery-dev/orrery/internal/versions"
)

// BinDirEnv names a directory holding etcd and kube-apiserver, instead of
// the components build's.
const BinDirEnv = "ORRERY_APISERVER_BIN_DIR"

// Server is a running API server.
type Server struct {
	// Config reaches it as a member of system:masters.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file with the same
	// credentials, for tools that take one (Helm, kubectl).
	Kubeconfig string

	ca    *x509.Certificate
	caKey crypto.Signer
	dir   string
}

// Start runs etcd and kube-apiserver until the test ends, with a cluster
// CA of their own. It skips the test when the binaries are not built.
func Start(tb testing.TB) *Server {
	tb.Helper()
	ca, key := newCA(tb)
	return StartWithCA(tb, ca, key)
}

// StartWithCA is Start with the cluster CA ca, whose key signs the API
// server's serving certificate and the admin's client certificate. The API
// server authenticates every client certificate ca issued (a node's from
// the join service, say), as a cluster's does.
func StartWithCA(tb testing.TB, ca *x509.Certificate, key crypto.Signer) *Server {
	tb.Helper()
	return startWith(tb, ca, key)
}

// StartWithKubeletCA is Start with an API server that checks kubelets'
// serving certificates against the CA certificate in file, as a
// cluster's does for 'kubectl logs' and 'exec'.
func StartWithKubeletCA(tb testing.TB, file string) *Server {
	tb.Helper()
	ca, key := newCA(tb)
	return startWith(tb, ca, key, "--kubelet-certificate-authority="+file)
}

func startWith(tb testing.TB, ca *x509.Certificate, key crypto.Signer, extra ...string) *Server {
	tb.Helper()
	bin, err := binDir()
	if err != nil {
		tb.Skip(err)
	}
	dir := tb.TempDir()
	etcdURL := startEtcd(tb, bin, dir)
	pki := newPKI(tb, dir, ca, key)
	// A port freePort found free can still be taken before the API
	// server binds it, by another test process that picked the same
	// one: CI saw "bind: address already in use". Another port then.
	for attempt := 1; ; attempt++ {
		port := freePort(tb)
		logPath := filepath.Join(dir, fmt.Sprintf("kube-apiserver-%d.log", attempt))
		args := append(apiserverArgs(etcdURL, pki, dir, port), auditArgs(tb, dir)...)
		args = append(args, extra...)
		apiserver := start(tb, filepath.Join(bin, "kube-apiserver"), args, logPath)
		cfg := &rest.Config{
			Host: "https://127.0.0.1:" + strconv.Itoa(port),
			TLSClientConfig: rest.TLSClientConfig{
				CAData: pki.caPEM, CertData: pki.adminCertPEM, KeyData: pki.adminKeyPEM,
			},
			QPS: 1000, Burst: 2000,
		}
		err := waitReady(cfg, apiserver, logPath)
		if errors.Is(err, errPortTaken) && attempt < 3 {
			continue
		}
		if err != nil {
			tb.Fatal(err)
		}
		s := &Server{Config: cfg, Kubeconfig: filepath.Join(dir, "admin.conf"), ca: ca, caKey: key, dir: dir}
		if err := writeKubeconfig(s.Kubeconfig, cfg); err != nil {
			tb.Fatal(err)
		}
		return s
	}
}

// ControllerManager runs kube-controller-manager against s until the test
// ends, as a member of system:masters, with no serving port and no leader
// election, and args (which controllers, which CAs) after those. It skips
// the test when the binary is not built.
func (s *Server) ControllerManager(tb testing.TB, args ...string) {
	tb.Helper()
	bin, err := binDir()
	if err != nil {
		tb.Skip(err)
	}
	path := filepath.Join(bin, "kube-controller-manager")
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("no kube-controller-manager (run 'make testbin'): %v", err)
	}
	base := []string{"--kubeconfig=" + s.Kubeconfig, "--leader-elect=false", "--secure-port=0"}
	start(tb, path, append(base, args...), filepath.Join(s.dir, "kube-controller-manager.log"))
}

// apiserverArgs are the API server's flags, as kubeadm sets those that
// matter to the tests.
func apiserverArgs(etcdURL string, pki pki, dir string, port int) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + pki.serverCert, "--tls-private-key-file=" + pki.serverKey,
		"--client-ca-file=" + pki.caCert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki.saKey, "--service-account-signing-key-file=" + pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// As kubeadm sets them: what a node's credentials may do is
		// part of what the tests check.
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// As kubeadm sets it: Orrery's charts run privileged containers.
		"--allow-privileged=true",
		// Nothing creates the default ServiceAccount without a
		// controller manager; objects are what tests need, not pods.
		"--disable-admission-plugins=ServiceAccount",
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
	}
}

// binDir finds etcd and kube-apiserver.
func binDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d, checkBins(d)
	}
	root, err := checkout()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(releaseDir(root), "imagebin")
	return bin, checkBins(bin)
}

// Kubeadm returns the path of the kubeadm the components build made (the
// node image's), for tests that drive it against a Server; it skips the
// test when kubeadm is not built.
func Kubeadm(tb testing.TB) string {
	tb.Helper()
	root, err := checkout()
	if err != nil {
		tb.Skip(err)
	}
	path := filepath.Join(releaseDir(root), "bin", "kubeadm")
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("no kubeadm (run 'make testbin'): %v", err)
	}
	return path
}

// releaseDir is where 'make testbin' builds the default Kubernetes
// release's programs (image/components/build.sh).
func releaseDir(checkout string) string {
	return filepath.Join(checkout, "build", "components", "releases", versions.Default)
}

// checkout finds the Orrery checkout above the working directory.
func checkout() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "image", "components")); err == nil {
				return d, nil
			}
		}
		if filepath.Dir(d) == d {
			return "", errors.New("no checkout of Orrery above the working directory to find build/components in")
		}
	}
}

func checkBins(d string) error {
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(d, b)); err != nil {
			return fmt.Errorf("no %s in %s (run 'make components', or set %s): %w", b, d, BinDirEnv, err)
		}
	}
	return nil
}

func startEtcd(tb testing.TB, bin, dir string) string {
	tb.Helper()
	client, peer := freePort(tb), freePort(tb)
	url := "http://127.0.0.1:" + strconv.Itoa(client)
	start(tb, filepath.Join(bin, "etcd"), []string{
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
		"--listen-peer-urls=http://127.0.0.1:" + strconv.Itoa(peer),
		"--initial-advertise-peer-urls=http://127.0.0.1:" + strconv.Itoa(peer),
		"--initial-cluster=default=http://127.0.0.1:" + strconv.Itoa(peer),
		// A test's data need not survive a power cut.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}, filepath.Join(dir, "etcd.log"))
	return url
}

// start runs bin until the test ends; its output goes to logPath, which
// a failing test shows. A wait for it can watch the returned process and
// stop as soon as it ends.
func start(tb testing.TB, bin string, args []string, logPath string) *process {
	tb.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		tb.Fatalf("start %s: %v", bin, err)
	}
	p := &process{done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		logFile.Close()
		if tb.Failed() {
			b, _ := os.ReadFile(logPath)
			tb.Logf("%s log (end):\n%s", filepath.Base(bin), tail(b, 4000))
		}
	})
	return p
}

// process is a started program; err says how it ended once done is closed.
type process struct {
	done chan struct{}
	err  error
}

// errPortTaken is an API server that exited because its port was taken.
var errPortTaken = errors.New("kube-apiserver's port was taken")

// waitReady waits up to a minute for the API server to be ready, and
// stops at once if it exits (a port taken, a bad flag): its log says why.
func waitReady(cfg *rest.Config, apiserver *process, logPath string) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return nil
		}
		last = err
		select {
		case <-apiserver.done:
			b, _ := os.ReadFile(logPath)
			if bytes.Contains(b, []byte("address already in use")) {
				return errPortTaken
			}
			return fmt.Errorf("kube-apiserver exited before it was ready (%v):\n%s", apiserver.err, tail(b, 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(logPath)
	return fmt.Errorf("kube-apiserver not ready after a minute (%v):\n%s", last, tail(b, 4000))
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// freePort picks a loopback port that is free now, below the kernel's
// ephemeral range: a port from that range (what Listen(":0") gives) can be
// taken, between freePort closing it and etcd or the API server binding
// it, by any outgoing connection of the tests running in parallel, and
// CI saw the API server exit with "address already in use".
func freePort(tb testing.TB) int {
	tb.Helper()
	lo := ephemeralLow()
	for range 100 {
		port := 10000 + mathrand.IntN(lo-10000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	tb.Fatalf("no free loopback port between 10000 and %d", lo)
	return 0
}

// ephemeralLow is the lowest port of the kernel's ephemeral range, at
// least 20000 so that freePort has ports to choose from.
func ephemeralLow() int {
	const fallback = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return fallback
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return fallback
	}
	lo, err := strconv.Atoi(fields[0])
	if err != nil || lo < 20000 {
		return 20000
	}
	return lo
}

func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

// pki is the test cluster's CA, the API server's serving certificate and
// service-account key, and an admin client certificate.
type pki struct {
	caCert, serverCert, serverKey, saKey string
	caPEM, adminCertPEM, adminKeyPEM     []byte
}

func newCA(tb testing.TB) (*x509.Certificate, crypto.Signer) {
	tb.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "apiservertest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatal(err)
	}
	return ca, caKey
}

// signLeaf signs tmpl with a new P-256 key for a day, from an hour ago.
func signLeaf(tb testing.TB, ca *x509.Certificate, caKey crypto.Signer, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func newPKI(tb testing.TB, dir string, ca *x509.Certificate, caKey crypto.Signer) pki {
	tb.Helper()
	leaf := func(serial int64, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
		tmpl.SerialNumber = big.NewInt(serial)
		return signLeaf(tb, ca, caKey, tmpl)
	}
	serverCert, serverKey := leaf(2, &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	adminCert, adminKey := leaf(3, &x509.Certificate{Subject: pkix.Name{CommonName: "test-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		tb.Fatal(err)
	}
	p := pki{
		caCert: filepath.Join(dir, "ca.crt"), serverCert: filepath.Join(dir, "apiserver.crt"),
		serverKey: filepath.Join(dir, "apiserver.key"), saKey: filepath.Join(dir, "sa.key"),
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), adminCertPEM: adminCert, adminKeyPEM: adminKey,
	}
	for path, data := range map[string][]byte{
		p.caCert: p.caPEM, p.serverCert: serverCert, p.serverKey: serverKey,
		p.saKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return p
}
