package keptfiles

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

func newCA(t testing.TB, name string) []byte {
	der, _ := newCAKey(t, name)
	return der
}

func newCAKey(t testing.TB, name string) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// kubeletCert is a node's client certificate, signed by the CA of caDER
// with caKey.
func kubeletCert(t testing.TB, caDER []byte, caKey *ecdsa.PrivateKey) []byte {
	t.Helper()
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "system:node:worker-0", Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pemCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

const endpoint = "10.0.2.5:6443"

// kubeconfigWith is kubelet.conf as kubelet writes it after its TLS
// bootstrap.
func kubeconfigWith(caDER []byte, server, user string) string {
	return `apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: ` + base64.StdEncoding.EncodeToString([]byte(pemCert(caDER))) + `
    server: ` + server + `
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
kind: Config
preferences: {}
users:
- name: default-auth
  user:
` + user
}

const certUser = `    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
`

// kubeletConfig is /var/lib/kubelet/config.yaml as kubeadm 1.36 writes it
// from Orrery's configuration (abridged to what is not defaults).
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
enableSystemLogHandler: true
enableSystemLogQuery: true
imageGCHighThresholdPercent: 100
kind: KubeletConfiguration
resolvConf: /run/systemd/resolve/resolv.conf
rotateCertificates: true
runtimeRequestTimeout: 10m0s
staticPodPath: /etc/kubernetes/manifests
`

const kubeletFlagsEnv = `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock --hostname-override=worker-0 --node-ip=10.0.2.17 --v=1"` + "\n"

const apiserverImage = "registry.k8s.io/kube-apiserver:v1.36.3"

func podManifest(name, image string) string {
	return `apiVersion: v1
kind: Pod
metadata:
  labels:
    component: ` + name + `
    tier: control-plane
  name: ` + name + `
  namespace: kube-system
spec:
  containers:
  - command:
    - ` + name + `
    - --advertise-address=10.0.2.5
    image: ` + image + `
    imagePullPolicy: Never
    name: ` + name + `
    volumeMounts:
    - mountPath: /etc/kubernetes/pki
      name: k8s-certs
      readOnly: true
  hostNetwork: true
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki
      type: DirectoryOrCreate
    name: k8s-certs
`
}

type node struct {
	root string
	ca   []byte
}

func write(t testing.TB, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// worker is a joined worker's kept files.
func worker(t testing.TB) node {
	n := node{root: t.TempDir(), ca: newCA(t, "kubernetes")}
	write(t, n.root, "etc/kubernetes/kubelet.conf", kubeconfigWith(n.ca, "https://"+endpoint, certUser))
	write(t, n.root, "etc/kubernetes/pki/ca.crt", pemCert(n.ca))
	write(t, n.root, KubeletConfig, kubeletConfig)
	write(t, n.root, KubeletFlags, kubeletFlagsEnv)
	return n
}

func workerWithoutStaticPods(t testing.TB) node {
	n := worker(t)
	write(t, n.root, KubeletConfig, strings.Replace(kubeletConfig, "staticPodPath: /etc/kubernetes/manifests\n", "", 1))
	return n
}

// controlPlane is a control plane's, with the baked image of its API
// server.
func controlPlane(t testing.TB) node {
	n := worker(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write(t, n.root, "etc/kubernetes/pki/ca.key", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
	write(t, n.root, "etc/kubernetes/admin.conf", kubeconfigWith(n.ca, "https://10.0.2.5:6443", "    client-certificate-data: AAAA\n    client-key-data: AAAA\n"))
	write(t, n.root, "etc/kubernetes/manifests/kube-apiserver.yaml", podManifest("kube-apiserver", apiserverImage))
	write(t, n.root, BakedImagesDir+"/kube-apiserver/index.json",
		`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:00","size":1,"annotations":{"io.containerd.image.name":"`+apiserverImage+`"}}]}`)
	return n
}

func (n node) check(t *testing.T, f Facts) ([]string, error) {
	t.Helper()
	var said []string
	c := &Checker{Root: n.root, Say: func(format string, args ...any) {
		said = append(said, strings.TrimSpace(strings.ReplaceAll(fmt.Sprintf(format, args...), n.root, "")))
	}}
	err := c.Check(f)
	return said, err
}

func exists(root, rel string) bool {
	_, err := os.Lstat(filepath.Join(root, rel))
	return err == nil
}

func TestUntouchedNodesPass(t *testing.T) {
	for name, tt := range map[string]struct {
		n node
		f func(node) Facts
	}{
		"worker":                 {worker(t), func(n node) Facts { return Facts{CACert: n.ca, Endpoint: endpoint} }},
		"control plane":          {controlPlane(t), func(n node) Facts { return Facts{ControlPlane: true, CACert: n.ca, Endpoint: endpoint} }},
		"control plane recovery": {controlPlane(t), func(node) Facts { return Facts{ControlPlane: true} }},
		"not joined yet":         {node{root: t.TempDir(), ca: newCA(t, "kubernetes")}, func(n node) Facts { return Facts{CACert: n.ca, Endpoint: endpoint} }},
		// What a worker's join writes since its kubelet reads no static pods.
		"worker without a static pod path": {workerWithoutStaticPods(t), func(n node) Facts { return Facts{CACert: n.ca, Endpoint: endpoint} }},
	} {
		t.Run(name, func(t *testing.T) {
			said, err := tt.n.check(t, tt.f(tt.n))
			if err != nil || len(said) > 0 {
				t.Fatalf("Check() = %v, said %q; want nil, nothing", err, said)
			}
		})
	}
}

// TestPlantedFilesAreRemoved: what kubeadm does not write for the node's
// role is gone before the OS starts, whatever it is.
func TestPlantedFilesAreRemoved(t *testing.T) {
	n := worker(t)
	planted := []string{
		"etc/kubernetes/manifests/backdoor.yaml", // a static pod on a worker
		"etc/kubernetes/admin.conf",              // a control plane's name, on a worker
		"etc/kubernetes/pki/ca.key",
		"etc/kubernetes/tmp/x",
		"etc/kubernetes/kubelet.conf.d/x.conf",
	}
	for _, p := range planted {
		write(t, n.root, p, podManifest("kube-apiserver", apiserverImage))
	}
	// A name kubeadm writes, as something else.
	if err := os.Remove(filepath.Join(n.root, "etc/kubernetes/pki/ca.crt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/var/lib/evil", filepath.Join(n.root, "etc/kubernetes/pki/ca.crt")); err != nil {
		t.Fatal(err)
	}
	said, err := n.check(t, Facts{CACert: n.ca, Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(planted, "etc/kubernetes/manifests") {
		if exists(n.root, p) {
			t.Errorf("%s is still there", p)
		}
	}
	if b, err := os.ReadFile(filepath.Join(n.root, "etc/kubernetes/pki/ca.crt")); err != nil || string(b) != pemCert(n.ca) {
		t.Errorf("ca.crt = %q, %v; want the join service's CA", b, err)
	}
	joined := strings.Join(said, "\n")
	for _, want := range []string{"removed /etc/kubernetes/manifests: not a file kubeadm keeps on a worker", "removed /etc/kubernetes/pki/ca.crt", "rewrote /etc/kubernetes/pki/ca.crt"} {
		if !strings.Contains(joined, want) {
			t.Errorf("said\n%s\nwant a line with %q", joined, want)
		}
	}
	if said, err := n.check(t, Facts{CACert: n.ca, Endpoint: endpoint}); err != nil || len(said) > 0 {
		t.Errorf("second check: %v, said %q; want nothing", err, said)
	}
}

func TestControlPlanePrunesUnknownManifests(t *testing.T) {
	n := controlPlane(t)
	write(t, n.root, "etc/kubernetes/manifests/backdoor.yaml", podManifest("kube-apiserver", apiserverImage))
	if _, err := n.check(t, Facts{ControlPlane: true, CACert: n.ca}); err != nil {
		t.Fatal(err)
	}
	if exists(n.root, "etc/kubernetes/manifests/backdoor.yaml") || !exists(n.root, "etc/kubernetes/manifests/kube-apiserver.yaml") {
		t.Error("want backdoor.yaml removed and kube-apiserver.yaml kept")
	}
}

// TestChangedFilesAreRefused: a kept file that decides what runs, changed
// so that something else would run or be trusted, stops the boot.
func TestChangedFilesAreRefused(t *testing.T) {
	other := newCA(t, "attacker")
	for name, tt := range map[string]struct {
		controlPlane bool
		file, data   string
		want         string
	}{
		"exec plugin": {file: "etc/kubernetes/kubelet.conf", want: "exec credential plugin",
			data: kubeconfigWith(nil, "https://"+endpoint, "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /var/lib/evil\n")},
		"auth provider": {file: "etc/kubernetes/kubelet.conf", want: "auth provider",
			data: kubeconfigWith(nil, "https://"+endpoint, "    auth-provider:\n      name: oidc\n")},
		"other server": {file: "etc/kubernetes/kubelet.conf", want: `names server "https://10.0.2.99:6443"`,
			data: kubeconfigWith(nil, "https://10.0.2.99:6443", certUser)},
		"plain http": {file: "etc/kubernetes/kubelet.conf", want: "not an https URL",
			data: kubeconfigWith(nil, "http://"+endpoint, certUser)},
		"other CA": {file: "etc/kubernetes/kubelet.conf", want: "trusts another CA",
			data: kubeconfigWith(other, "https://"+endpoint, certUser)},
		"CA file": {file: "etc/kubernetes/kubelet.conf", want: `trusts "/var/lib/ca.crt"`,
			data: strings.Replace(kubeconfigWith(nil, "https://"+endpoint, certUser), "certificate-authority-data: ", "certificate-authority: /var/lib/ca.crt\n    x: ", 1)},
		"no TLS check": {file: "etc/kubernetes/kubelet.conf", want: "skips TLS verification",
			data: strings.Replace(kubeconfigWith(nil, "https://"+endpoint, certUser), "    server:", "    insecure-skip-tls-verify: true\n    server:", 1)},
		"proxy": {file: "etc/kubernetes/kubelet.conf", want: "through a proxy",
			data: strings.Replace(kubeconfigWith(nil, "https://"+endpoint, certUser), "    server:", "    proxy-url: http://10.0.2.99\n    server:", 1)},
		"not yaml":       {file: "etc/kubernetes/kubelet.conf", data: "\x00\x01{[", want: "not a kubeconfig"},
		"static pod URL": {file: KubeletConfig, data: kubeletConfig + "staticPodURL: http://10.0.2.99/pods\n", want: "staticPodURL"},
		"static pod path": {file: KubeletConfig, want: `sets staticPodPath to "/var/lib/pods"`,
			data: strings.Replace(kubeletConfig, "staticPodPath: /etc/kubernetes/manifests", "staticPodPath: /var/lib/pods", 1)},
		"anonymous": {file: KubeletConfig, want: "authentication.anonymous.enabled",
			data: strings.Replace(kubeletConfig, "    enabled: false", "    enabled: true", 1)},
		"always allow": {file: KubeletConfig, want: "authorization.mode",
			data: strings.Replace(kubeletConfig, "mode: Webhook", "mode: AlwaysAllow", 1)},
		"read-only port":   {file: KubeletConfig, data: kubeletConfig + "readOnlyPort: 10255\n", want: "readOnlyPort"},
		"volume plugins":   {file: KubeletConfig, data: kubeletConfig + "volumePluginDir: /var/lib/plugins\n", want: "volumePluginDir"},
		"other CRI":        {file: KubeletConfig, data: strings.Replace(kubeletConfig, `containerRuntimeEndpoint: ""`, "containerRuntimeEndpoint: unix:///var/evil.sock", 1), want: "containerRuntimeEndpoint"},
		"no config":        {file: KubeletConfig, data: "kind: Pod\n", want: "apiVersion"},
		"extra flag":       {file: KubeletFlags, data: `KUBELET_KUBEADM_ARGS="--v=1 --config-dir=/var/lib/kubelet/conf.d"`, want: `"--config-dir=/var/lib/kubelet/conf.d"`},
		"credential exec":  {file: KubeletFlags, data: `KUBELET_KUBEADM_ARGS="--image-credential-provider-bin-dir=/var/lib/bin"`, want: "image-credential-provider-bin-dir"},
		"second variable":  {file: KubeletFlags, data: kubeletFlagsEnv + "KUBELET_CONFIG_ARGS=--config=/var/lib/evil.yaml\n", want: "not one line"},
		"other CRI flag":   {file: KubeletFlags, data: `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/evil.sock"`, want: "not a value the node writes"},
		"flag twice":       {file: KubeletFlags, data: `KUBELET_KUBEADM_ARGS="--v=1 --v=2"`, want: "not a value the node writes"},
		"shell expansion":  {file: KubeletFlags, data: `KUBELET_KUBEADM_ARGS="--v=1 $KUBELET_CONFIG_ARGS"`, want: "not one line"},
		"not a file":       {file: KubeletFlags, want: "not a regular file"},
		"unbaked image":    {controlPlane: true, file: "etc/kubernetes/manifests/kube-apiserver.yaml", data: podManifest("kube-apiserver", "evil.example/apiserver:1"), want: `image "evil.example/apiserver:1"`},
		"other command":    {controlPlane: true, file: "etc/kubernetes/manifests/kube-apiserver.yaml", data: strings.Replace(podManifest("kube-apiserver", apiserverImage), "    - kube-apiserver\n", "    - /bin/sh\n", 1), want: `command "/bin/sh"`},
		"second container": {controlPlane: true, file: "etc/kubernetes/manifests/kube-apiserver.yaml", data: strings.Replace(podManifest("kube-apiserver", apiserverImage), "  containers:\n", "  containers:\n  - name: x\n    image: "+apiserverImage+"\n", 1), want: "has 2 containers"},
		"init container":   {controlPlane: true, file: "etc/kubernetes/manifests/kube-apiserver.yaml", data: strings.Replace(podManifest("kube-apiserver", apiserverImage), "  containers:\n", "  initContainers:\n  - name: x\n    image: busybox\n  containers:\n", 1), want: "1 init"},
		"garbage key":      {controlPlane: true, file: "etc/kubernetes/pki/ca.key", data: "not a key", want: "not one PEM PRIVATE KEY"},
	} {
		t.Run(name, func(t *testing.T) {
			n := worker(t)
			if tt.controlPlane {
				n = controlPlane(t)
			}
			data := tt.data
			if strings.Contains(data, "certificate-authority-data: "+base64.StdEncoding.EncodeToString([]byte(pemCert(nil)))) {
				data = strings.Replace(data, base64.StdEncoding.EncodeToString([]byte(pemCert(nil))), base64.StdEncoding.EncodeToString([]byte(pemCert(n.ca))), 1)
			}
			if tt.want == "not a regular file" {
				if err := os.Remove(filepath.Join(n.root, tt.file)); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("/var/lib/evil.env", filepath.Join(n.root, tt.file)); err != nil {
					t.Fatal(err)
				}
			} else {
				write(t, n.root, tt.file, data)
			}
			_, err := n.check(t, Facts{ControlPlane: tt.controlPlane, CACert: n.ca, Endpoint: endpoint})
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "/"+tt.file) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check() = %v; want ErrRefused naming /%s and %q", err, tt.file, tt.want)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY-----") {
				t.Errorf("the error shows a key: %v", err)
			}
		})
	}
}

// TestRecoveryKeepsCheckingTheCA: without the join service's word, the
// kept CA is the one kubeconfigs must trust, and it must be a CA.
func TestRecoveryKeepsCheckingTheCA(t *testing.T) {
	n := controlPlane(t)
	write(t, n.root, "etc/kubernetes/admin.conf", kubeconfigWith(newCA(t, "attacker"), "https://10.0.2.5:6443", certUser))
	if _, err := n.check(t, Facts{ControlPlane: true}); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "admin.conf trusts another CA") {
		t.Errorf("Check() = %v; want admin.conf refused", err)
	}
	write(t, n.root, "etc/kubernetes/pki/ca.crt", "garbage")
	if _, err := n.check(t, Facts{ControlPlane: true}); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "ca.crt") {
		t.Errorf("Check() = %v; want ca.crt refused", err)
	}
}

func FuzzKeptFiles(f *testing.F) {
	ca := newCA(f, "kubernetes")
	cert, err := x509.ParseCertificate(ca)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(kubeconfigWith(ca, "https://"+endpoint, certUser)))
	f.Add([]byte(kubeletConfig))
	f.Add([]byte(kubeletFlagsEnv))
	f.Add([]byte(podManifest("kube-apiserver", apiserverImage)))
	images := map[string]bool{apiserverImage: true}
	f.Fuzz(func(t *testing.T, b []byte) {
		// Never a panic, and an error never repeats more than a bounded
		// part of the file.
		for _, err := range []error{
			checkKubeconfig(b, cert, endpoint), checkKubeletConfig(b), checkKubeletFlags(b),
			checkManifest(b, "kube-apiserver", images), checkPEM(b, "PRIVATE KEY"),
		} {
			if err != nil && len(err.Error()) > 4096 {
				t.Errorf("error of %d bytes", len(err.Error()))
			}
		}
		_, _ = parseCerts(b)
	})
}

// TestPendingJoin: a join a reboot interrupted is finished at boot with
// the ticket kept on the state disk, by kubeadm, after the initrd's
// check: a ticket root on the node wrote must not pass for the cluster's.
func TestPendingJoin(t *testing.T) {
	ca, caKey := newCAKey(t, "kubernetes")
	otherCA, otherKey := newCAKey(t, "attacker")
	good := func() *joinpb.IssueJoinTicketResponse {
		return &joinpb.IssueJoinTicketResponse{ClusterCaCert: ca, ApiServerEndpoint: endpoint, KubeletCert: kubeletCert(t, ca, caKey)}
	}
	for name, tt := range map[string]struct {
		ticket       func() *joinpb.IssueJoinTicketResponse
		raw          string
		controlPlane bool
		want         string
	}{
		"the cluster's": {ticket: good},
		"a control plane": {controlPlane: true, ticket: func() *joinpb.IssueJoinTicketResponse {
			g := good()
			g.ControlPlaneFiles = []*joinpb.ControlPlaneFile{{Name: "ca.key"}}
			return g
		}},
		"another CA": {want: "another cluster CA", ticket: func() *joinpb.IssueJoinTicketResponse {
			return &joinpb.IssueJoinTicketResponse{ClusterCaCert: otherCA, ApiServerEndpoint: endpoint, KubeletCert: kubeletCert(t, otherCA, otherKey)}
		}},
		"another API server": {want: `API server "10.0.2.99:6443"`, ticket: func() *joinpb.IssueJoinTicketResponse { g := good(); g.ApiServerEndpoint = "10.0.2.99:6443"; return g }},
		"CA keys on a worker": {want: "control plane's ticket on a worker", ticket: func() *joinpb.IssueJoinTicketResponse {
			g := good()
			g.ControlPlaneFiles = []*joinpb.ControlPlaneFile{{Name: "ca.key"}}
			return g
		}},
		"a certificate of another CA": {want: "kubelet certificate is not the cluster CA's", ticket: func() *joinpb.IssueJoinTicketResponse {
			g := good()
			g.KubeletCert = kubeletCert(t, otherCA, otherKey)
			return g
		}},
		"garbage": {raw: "{\"ticket\": 7}", want: "does not hold a join ticket"},
	} {
		t.Run(name, func(t *testing.T) {
			n := node{root: t.TempDir(), ca: ca}
			dir := filepath.Join(n.root, handoff.StateDir)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if tt.raw != "" {
				write(t, dir, pendingjoin.File, tt.raw)
			} else if err := pendingjoin.Save(dir, tt.ticket(), []byte("key")); err != nil {
				t.Fatal(err)
			}
			_, err := n.check(t, Facts{ControlPlane: tt.controlPlane, CACert: ca, Endpoint: endpoint})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Check() = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "/var/lib/orrery/pending-join.json") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check() = %v; want ErrRefused naming the ticket and %q", err, tt.want)
			}
		})
	}
}

// TestInstanceConfigIsKubeadmsOwn: kubeadm's upgrade merges the kept
// instance-config.yaml into kubelet's configuration; what root on the
// node planted there is gone after the next boot's check, before any
// upgrade can merge it.
func TestInstanceConfigIsKubeadmsOwn(t *testing.T) {
	for name, plant := range map[string]func(t *testing.T, root string){
		"static pod URL": func(t *testing.T, root string) {
			write(t, root, KubeletInstanceConfig, InstanceConfig+"staticPodURL: http://203.0.113.9/pods\n")
		},
		"anonymous access": func(t *testing.T, root string) {
			write(t, root, KubeletInstanceConfig, "authentication:\n  anonymous:\n    enabled: true\nauthorization:\n  mode: AlwaysAllow\n")
		},
		"a link": func(t *testing.T, root string) {
			if err := os.Symlink("/var/lib/evil.yaml", filepath.Join(root, KubeletInstanceConfig)); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			n := worker(t)
			plant(t, n.root)
			said, err := n.check(t, Facts{CACert: n.ca, Endpoint: endpoint})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(n.root, KubeletInstanceConfig)); err != nil || string(got) != InstanceConfig {
				t.Fatalf("instance-config.yaml after the check: %q, %v; want kubeadm's line", got, err)
			}
			if !strings.Contains(strings.Join(said, "\n"), "rewrote /"+KubeletInstanceConfig) {
				t.Errorf("the console was not told: %q", said)
			}
		})
	}
	n := worker(t)
	write(t, n.root, KubeletInstanceConfig, InstanceConfig)
	if said, err := n.check(t, Facts{CACert: n.ca, Endpoint: endpoint}); err != nil || len(said) != 0 {
		t.Fatalf("kubeadm's own instance-config.yaml: said %q, %v; want it left alone", said, err)
	}
}
