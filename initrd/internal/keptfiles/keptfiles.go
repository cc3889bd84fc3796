// Package keptfiles checks, in the initrd, the few files a node keeps on
// its state disk that decide what its OS runs, before the OS reads them.
//
// Everything the node runs comes from the measured, read-only root; the
// state disk holds data (see the initrd's statedisk.Layout). But kubeadm
// writes its configuration once, at the node's first join, and kubelet
// and the control plane read it on every boot: /etc/kubernetes (kept on
// the state disk), /var/lib/kubelet/config.yaml and
// /var/lib/kubelet/kubeadm-flags.env. Root on a node (a container escape)
// can change them, and the node would still attest with its genuine
// measurements after a reboot and get its disk key: a static pod, an
// exec credential plugin in a kubeconfig, a kubelet flag or an API server
// of its own would then run on every boot. So at every boot:
//
//   - a name kubeadm does not write for the node's role, or anything but a
//     regular file or directory, is removed (and said on the console);
//   - the cluster CA certificate is rewritten from the join service's
//     ticket, when the disk key came from one;
//   - a join ticket kept for a join a reboot interrupted (pendingjoin),
//     which bootstrapperd would finish with kubeadm, must be the cluster's;
//   - every kept file that decides what runs is checked for the settings
//     Orrery's kubeadm configuration gives it, and a file that fails is
//     refused (ErrRefused): the node does not boot, and the owner removes
//     it from the cluster.
package keptfiles

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
	"github.com/orrery-dev/orrery/internal/strictjson"
)

// ErrRefused means a kept file is not what the node wrote: root on the
// node changed it.
var ErrRefused = errors.New("refusing what the state disk keeps")

// Facts are what the node knows of itself and its cluster from outside
// its state disk.
type Facts struct {
	// ControlPlane is true on a node the owner approved as a control
	// plane: the join service's word in a rejoin ticket, or the owner's
	// in a recovery, which the owner sends only to the instance its
	// records name as the control plane. Never the metadata's: the host
	// writes it. A worker keeps no static pods and no cluster keys.
	ControlPlane bool
	// CACert is the cluster CA certificate (DER) from the join service
	// or the owner; nil only in tests of older cases: the node's own copy
	// is then only checked to be a CA certificate.
	CACert []byte
	// Endpoint is the API server (host:port) from the join service; a
	// worker's kubelet talks to it and nothing else. "" is not checked.
	Endpoint string
}

// Checker checks the kept files of the OS at Root.
type Checker struct {
	// Root is the OS's root, with the state disk and /etc/kubernetes
	// mounted as the initrd mounts them.
	Root string
	// Say reports what was changed; nil says nothing.
	Say func(format string, args ...any)
}

// Paths of the kept files, relative to the OS's root.
const (
	KubernetesDir = "etc/kubernetes"
	KubeletConfig = "var/lib/kubelet/config.yaml"
	KubeletFlags  = "var/lib/kubelet/kubeadm-flags.env"
	// KubeletInstanceConfig is a patch that kubeadm's upgrade merges into
	// kubelet's configuration, after Orrery's own patches: kubeadm
	// writes one line in it, and kubelet never reads it.
	KubeletInstanceConfig = "var/lib/kubelet/instance-config.yaml"
	BakedImagesDir        = "usr/share/orrery/images"
	caCertPath            = "/etc/kubernetes/pki/ca.crt"
	// containerdSocket is the CRI endpoint kubeadm is configured with.
	containerdSocket = "unix:///run/containerd/containerd.sock"
)

// kind says what a kept name is and how it is checked.
type kind int

const (
	dir kind = iota
	kubeconfig
	certificate
	privateKey
	publicKey
	manifest
)

// workerFiles are what kubeadm join writes on a worker
// (bootstrap-kubelet.conf until kubelet has its own certificate).
var workerFiles = map[string]kind{
	"kubelet.conf":           kubeconfig,
	"bootstrap-kubelet.conf": kubeconfig,
	"pki":                    dir,
	"pki/ca.crt":             certificate,
}

// controlPlaneFiles are what kubeadm init or join --control-plane writes
// on a control plane (super-admin.conf: the first one only).
var controlPlaneFiles = func() map[string]kind {
	m := map[string]kind{
		"admin.conf": kubeconfig, "super-admin.conf": kubeconfig,
		"controller-manager.conf": kubeconfig, "scheduler.conf": kubeconfig,
		"pki/etcd": dir, "pki/sa.key": privateKey, "pki/sa.pub": publicKey,
		"manifests": dir,
	}
	for _, pair := range []string{"ca", "apiserver", "apiserver-kubelet-client", "apiserver-etcd-client",
		"front-proxy-ca", "front-proxy-client", "etcd/ca", "etcd/server", "etcd/peer", "etcd/healthcheck-client",
		"kubelet-serving-ca"} {
		m["pki/"+pair+".crt"] = certificate
		m["pki/"+pair+".key"] = privateKey
	}
	for c := range staticPods {
		m["manifests/"+c+".yaml"] = manifest
	}
	for n, k := range workerFiles {
		m[n] = k
	}
	return m
}()

// staticPods are the control plane's static pods, by the name of their
// one container, which is also its command.
var staticPods = map[string]bool{"etcd": true, "kube-apiserver": true, "kube-controller-manager": true, "kube-scheduler": true}

// Check checks the kept files (see the package comment). It returns an
// error wrapping ErrRefused, naming the file and what is wrong with it,
// if one decides what runs and is not what the node wrote.
func (c *Checker) Check(f Facts) error {
	allowed := workerFiles
	if f.ControlPlane {
		allowed = controlPlaneFiles
	}
	if err := c.prune(allowed); err != nil {
		return err
	}
	ca, err := c.clusterCA(f)
	if err != nil {
		return err
	}
	var images map[string]bool
	for _, name := range slices.Sorted(maps.Keys(allowed)) {
		path := filepath.Join(c.Root, KubernetesDir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) || allowed[name] == dir {
			continue
		}
		if err != nil {
			return fmt.Errorf("read /%s/%s: %w", KubernetesDir, name, err)
		}
		switch allowed[name] {
		case kubeconfig:
			endpoint := ""
			if name == "kubelet.conf" && !f.ControlPlane {
				endpoint = f.Endpoint
			}
			err = checkKubeconfig(b, ca, endpoint)
		case certificate:
			_, err = parseCerts(b)
		case privateKey:
			err = checkPEM(b, "PRIVATE KEY")
		case publicKey:
			err = checkPEM(b, "PUBLIC KEY")
		case manifest:
			if images == nil {
				if images, err = c.bakedImages(); err != nil {
					return err
				}
			}
			err = checkManifest(b, strings.TrimSuffix(filepath.Base(name), ".yaml"), images)
		}
		if err != nil {
			return refused("/"+KubernetesDir+"/"+name, err)
		}
	}
	if err := c.checkPendingJoin(f, ca); err != nil {
		return err
	}
	if err := c.checkFile(KubeletConfig, checkKubeletConfig); err != nil {
		return err
	}
	if err := c.checkFile(KubeletFlags, checkKubeletFlags); err != nil {
		return err
	}
	return c.restoreInstanceConfig()
}

// InstanceConfig is the kubelet instance configuration kubeadm writes for
// Orrery's nodes (its CRI socket, nothing else).
const InstanceConfig = "containerRuntimeEndpoint: \"" + containerdSocket + "\"\n"

// restoreInstanceConfig makes a kept instance-config.yaml kubeadm's one
// line again. The file changes nothing at boot, so it is not refused;
// but kubeadm's next upgrade would merge whatever it holds into kubelet's
// configuration (a static pod URL, anonymous access), and the boot after
// would not see it come.
func (c *Checker) restoreInstanceConfig() error {
	path := filepath.Join(c.Root, KubeletInstanceConfig)
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read /%s: %w", KubeletInstanceConfig, err)
	}
	if fi.Mode().IsRegular() {
		if b, err := os.ReadFile(path); err == nil && string(b) == InstanceConfig {
			return nil
		}
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove /%s: %w", KubeletInstanceConfig, err)
	}
	if err := atomicfile.WriteFile(path, []byte(InstanceConfig), 0o644); err != nil {
		return fmt.Errorf("write /%s: %w", KubeletInstanceConfig, err)
	}
	c.say("rewrote /%s: it was not what kubeadm writes (root on this node may have changed it)", KubeletInstanceConfig)
	return nil
}

func refused(path string, err error) error {
	return fmt.Errorf("%w: %s %w", ErrRefused, path, err)
}

func (c *Checker) say(format string, args ...any) {
	if c.Say != nil {
		c.Say(format, args...)
	}
}

// checkPendingJoin checks the ticket of an interrupted join, which
// bootstrapperd finishes at this boot with kubeadm join, writing
// /etc/kubernetes after this check: it must be of the cluster that gave
// this boot its key (ca: the cluster CA; after a recovery, the node's
// own), reach its API server, and carry a control plane's keys only to a
// control plane.
func (c *Checker) checkPendingJoin(f Facts, ca *x509.Certificate) error {
	dir := filepath.Join(c.Root, handoff.StateDir)
	path := filepath.Join(handoff.StateDir, pendingjoin.File)
	if fi, err := os.Lstat(pendingjoin.Path(dir)); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	} else if !fi.Mode().IsRegular() {
		return refused(path, fmt.Errorf("is a %s, not a regular file", fi.Mode().Type()))
	}
	t, _, err := pendingjoin.Load(dir)
	if err != nil {
		return refused(path, errors.New("does not hold a join ticket"))
	}
	tca, err := x509.ParseCertificate(t.GetClusterCaCert())
	switch {
	case err != nil:
		return refused(path, errors.New("holds a ticket whose cluster CA certificate does not parse"))
	case ca != nil && !tca.Equal(ca):
		return refused(path, errors.New("holds a ticket of another cluster CA than the cluster's"))
	case f.Endpoint != "" && t.GetApiServerEndpoint() != f.Endpoint:
		return refused(path, fmt.Errorf("holds a ticket for API server %s; the cluster's is %s", q(t.GetApiServerEndpoint()), f.Endpoint))
	case !f.ControlPlane && len(t.GetControlPlaneFiles()) > 0:
		return refused(path, errors.New("holds a control plane's ticket on a worker"))
	}
	cert, err := x509.ParseCertificate(t.GetKubeletCert())
	if err != nil || cert.CheckSignatureFrom(tca) != nil {
		return refused(path, errors.New("holds a ticket whose kubelet certificate is not the cluster CA's"))
	}
	return nil
}

// checkFile checks the kept file at rel (relative to Root) with check;
// a file that is not there is fine (a node that has not joined yet:
// kubelet does not start without its configuration).
func (c *Checker) checkFile(rel string, check func([]byte) error) error {
	path := filepath.Join(c.Root, rel)
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read /%s: %w", rel, err)
	}
	if !fi.Mode().IsRegular() {
		return refused("/"+rel, fmt.Errorf("is a %s, not a regular file", fi.Mode().Type()))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read /%s: %w", rel, err)
	}
	if err := check(b); err != nil {
		return refused("/"+rel, err)
	}
	return nil
}

// prune removes from /etc/kubernetes whatever is not in allowed, or not a
// regular file or directory as allowed says.
func (c *Checker) prune(allowed map[string]kind) error {
	root := filepath.Join(c.Root, KubernetesDir)
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var remove []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		k, ok := allowed[rel]
		switch {
		case ok && k == dir && d.IsDir():
			return nil
		case ok && k != dir && d.Type().IsRegular():
			return nil
		}
		remove = append(remove, rel)
		if d.IsDir() {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read /%s: %w", KubernetesDir, err)
	}
	for _, rel := range remove {
		if err := os.RemoveAll(filepath.Join(root, rel)); err != nil {
			return fmt.Errorf("remove /%s/%s: %w", KubernetesDir, rel, err)
		}
		c.say("removed /%s/%s: not a file kubeadm keeps on a %s", KubernetesDir, rel, role(allowed))
	}
	return nil
}

func role(allowed map[string]kind) string {
	if _, ok := allowed["manifests"]; ok {
		return "control plane"
	}
	return "worker"
}

// clusterCA returns the cluster CA certificate the kept kubeconfigs must
// trust: the join service's, written over the node's copy if that
// differs, or the node's copy after a recovery.
func (c *Checker) clusterCA(f Facts) (*x509.Certificate, error) {
	path := filepath.Join(c.Root, KubernetesDir, "pki", "ca.crt")
	if f.CACert != nil {
		ca, err := x509.ParseCertificate(f.CACert)
		if err != nil {
			return nil, fmt.Errorf("the join service's cluster CA certificate: %w", err)
		}
		want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.CACert})
		have, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			if _, err := os.Stat(filepath.Join(c.Root, KubernetesDir, "kubelet.conf")); errors.Is(err, fs.ErrNotExist) {
				return ca, nil // not joined yet: nothing trusts it
			}
		} else if err != nil {
			return nil, fmt.Errorf("read %s: %w", caCertPath, err)
		}
		if !bytes.Equal(have, want) {
			if err := atomicfile.WriteFile(path, want, 0o644); err != nil {
				return nil, fmt.Errorf("write %s: %w", caCertPath, err)
			}
			c.say("rewrote %s from the join service's ticket: the kept copy was not the cluster's CA certificate", caCertPath)
		}
		return ca, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", caCertPath, err)
	}
	certs, err := parseCerts(b)
	if err != nil {
		return nil, refused(caCertPath, err)
	}
	if len(certs) != 1 || !certs[0].IsCA {
		return nil, refused(caCertPath, errors.New("is not one CA certificate"))
	}
	return certs[0], nil
}

// parseCerts parses PEM certificates; anything else in b is an error.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := bytes.TrimSpace(b); len(rest) > 0; rest = bytes.TrimSpace(rest) {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil || block.Type != "CERTIFICATE" {
			return nil, errors.New("holds something other than PEM certificates")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("holds a certificate that does not parse: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("holds no certificate")
	}
	return out, nil
}

// checkPEM checks that b is exactly one PEM block whose type ends in
// suffix (RSA PRIVATE KEY, EC PRIVATE KEY, PRIVATE KEY, PUBLIC KEY).
func checkPEM(b []byte, suffix string) error {
	block, rest := pem.Decode(b)
	if block == nil || !strings.HasSuffix(block.Type, suffix) || len(bytes.TrimSpace(rest)) != 0 {
		return fmt.Errorf("is not one PEM %s", suffix)
	}
	return nil
}

// kubeconfigFile is what checkKubeconfig reads of a kubeconfig. Pointers
// tell a field that is there from one that is not.
type kubeconfigFile struct {
	Clusters []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server   string  `json:"server"`
			CAFile   string  `json:"certificate-authority"`
			CAData   []byte  `json:"certificate-authority-data"`
			Insecure bool    `json:"insecure-skip-tls-verify"`
			ProxyURL *string `json:"proxy-url"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Exec         *json.RawMessage `json:"exec"`
			AuthProvider *json.RawMessage `json:"auth-provider"`
		} `json:"user"`
	} `json:"users"`
}

// checkKubeconfig checks a kubeconfig kubeadm wrote: every cluster in it
// is reached over TLS, directly, trusting the cluster CA only (ca; nil:
// the node's pki/ca.crt), at endpoint if that is not ""; and no user runs
// a program (an exec credential plugin or an auth provider), which kubelet
// or a control-plane component would run on every start.
func checkKubeconfig(b []byte, ca *x509.Certificate, endpoint string) error {
	var kc kubeconfigFile
	if err := strictjson.KubernetesYAML(b, &kc); err != nil {
		return fmt.Errorf("is not a kubeconfig: %w", err)
	}
	if len(kc.Clusters) == 0 {
		return errors.New("names no cluster")
	}
	for _, cl := range kc.Clusters {
		c := cl.Cluster
		u, err := url.Parse(c.Server)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("names server %s for cluster %s, not an https URL", q(c.Server), q(cl.Name))
		}
		if endpoint != "" && u.Host != endpoint {
			return fmt.Errorf("names server %s for cluster %s; the cluster's API server is %s", q(c.Server), q(cl.Name), endpoint)
		}
		if c.Insecure {
			return fmt.Errorf("skips TLS verification for cluster %s", q(cl.Name))
		}
		if c.ProxyURL != nil {
			return fmt.Errorf("reaches cluster %s through a proxy", q(cl.Name))
		}
		switch {
		case len(c.CAData) > 0:
			certs, err := parseCerts(c.CAData)
			if err != nil {
				return fmt.Errorf("certificate-authority-data of cluster %s %w", q(cl.Name), err)
			}
			if ca != nil && (len(certs) != 1 || !certs[0].Equal(ca)) {
				return fmt.Errorf("trusts another CA than the cluster's for cluster %s", q(cl.Name))
			}
		case c.CAFile == caCertPath:
		default:
			return fmt.Errorf("trusts %s for cluster %s; only the cluster's CA (%s or embedded) is kept", q(c.CAFile), q(cl.Name), caCertPath)
		}
	}
	for _, u := range kc.Users {
		if u.User.Exec != nil {
			return fmt.Errorf("runs an exec credential plugin for user %s", q(u.Name))
		}
		if u.User.AuthProvider != nil {
			return fmt.Errorf("uses an auth provider for user %s", q(u.Name))
		}
	}
	return nil
}

// bakedImages are the container images the root carries: the only ones a
// control plane's static pods may run.
func (c *Checker) bakedImages() (map[string]bool, error) {
	dir := filepath.Join(c.Root, BakedImagesDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the baked images: %w", err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "index.json"))
		if err == nil {
			err = json.Unmarshal(b, &index)
		}
		if err != nil {
			return nil, fmt.Errorf("baked image %s: %w", e.Name(), err)
		}
		for _, m := range index.Manifests {
			if n := m.Annotations["io.containerd.image.name"]; n != "" {
				out[n] = true
			}
		}
	}
	return out, nil
}

// staticPod is what checkManifest reads of a static pod.
type staticPod struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Containers          []container       `json:"containers"`
		InitContainers      []json.RawMessage `json:"initContainers"`
		EphemeralContainers []json.RawMessage `json:"ephemeralContainers"`
	} `json:"spec"`
}

type container struct {
	Name    string   `json:"name"`
	Image   string   `json:"image"`
	Command []string `json:"command"`
}

// checkManifest checks a control plane's static pod: one container,
// named as the component, running the component's own command from an
// image the root carries. Its flags, mounts and privileges are not
// checked here: in the OS, before kubelet runs it, bootstrapperd rewrites
// it whole from what kubeadm writes for this cluster (orrery-static-pods).
func checkManifest(b []byte, component string, images map[string]bool) error {
	var p staticPod
	if err := strictjson.KubernetesYAML(b, &p); err != nil {
		return fmt.Errorf("is not a pod: %w", err)
	}
	if p.APIVersion != "v1" || p.Kind != "Pod" {
		return fmt.Errorf("is a %s %s, not a v1 Pod", p.APIVersion, p.Kind)
	}
	if len(p.Spec.InitContainers) > 0 || len(p.Spec.EphemeralContainers) > 0 || len(p.Spec.Containers) != 1 {
		return fmt.Errorf("has %d containers, %d init and %d ephemeral; kubeadm's %s has one container", len(p.Spec.Containers), len(p.Spec.InitContainers), len(p.Spec.EphemeralContainers), component)
	}
	ctr := p.Spec.Containers[0]
	if ctr.Name != component || len(ctr.Command) == 0 || ctr.Command[0] != component {
		return fmt.Errorf("runs container %s with command %s; want %s", q(ctr.Name), q(firstOrEmpty(ctr.Command)), component)
	}
	if !images[ctr.Image] {
		return fmt.Errorf("runs image %s, which the OS image does not carry (it carries %s)", q(ctr.Image), strings.Join(slices.Sorted(maps.Keys(images)), ", "))
	}
	return nil
}

// q quotes a string read from a kept file for an error, shortened: the
// console shows it.
func q(s string) string {
	const max = 100
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}

func firstOrEmpty(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// checkKubeletConfig checks the settings of kubelet's configuration that
// decide what kubelet runs and whom it answers; kubeadm writes the rest
// from the cluster's configuration.
func checkKubeletConfig(b []byte) error {
	var cfg map[string]any
	if err := strictjson.KubernetesYAML(b, &cfg); err != nil {
		return fmt.Errorf("is not a kubelet configuration: %w", err)
	}
	get := func(path string) (any, bool) {
		var v any = cfg
		for _, k := range strings.Split(path, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, false
			}
			if v, ok = m[k]; !ok {
				return nil, false
			}
		}
		return v, true
	}
	for _, want := range []struct {
		path string
		// values are what the setting may be; absent says whether it
		// may be missing (kubelet's default is then as safe).
		values []any
		absent bool
	}{
		{"apiVersion", []any{"kubelet.config.k8s.io/v1beta1"}, false},
		{"kind", []any{"KubeletConfiguration"}, false},
		// A worker's has none (kubeadm.workerKubeletPatch): it then
		// reads no static pod at all.
		{"staticPodPath", []any{"/etc/kubernetes/manifests"}, true},
		{"authentication.anonymous.enabled", []any{false}, false},
		{"authentication.webhook.enabled", []any{true}, false},
		{"authentication.x509.clientCAFile", []any{caCertPath}, false},
		{"authorization.mode", []any{"Webhook"}, false},
		{"readOnlyPort", []any{int64(0)}, true},
		// kubeadm writes it empty: kubelet then takes the flag.
		{"containerRuntimeEndpoint", []any{"", containerdSocket}, true},
		{"resolvConf", []any{"/run/systemd/resolve/resolv.conf"}, false},
	} {
		v, ok := get(want.path)
		if !ok && want.absent {
			continue
		}
		if !ok || !slices.Contains(want.values, v) {
			return fmt.Errorf("sets %s to %s; the node's is %s", want.path, show(v, ok), show(want.values[len(want.values)-1], true))
		}
	}
	// Each of these makes kubelet run or fetch what the root does not
	// carry: pods from a URL, a CRI or image service of another
	// program, volume plugins from another directory.
	for _, name := range []string{"staticPodURL", "staticPodURLHeader", "imageServiceEndpoint", "volumePluginDir"} {
		if v, ok := cfg[name]; ok && v != "" {
			return fmt.Errorf("sets %s to %s; the node's leaves it unset", name, show(v, true))
		}
	}
	return nil
}

func show(v any, ok bool) string {
	if !ok {
		return "nothing"
	}
	b, err := json.Marshal(v)
	if err != nil || len(b) > 200 {
		return fmt.Sprintf("a %T", v)
	}
	return string(b)
}

// kubeletFlags are the flags kubeadm and Orrery's configuration give
// kubelet in kubeadm-flags.env, each with its check.
var kubeletFlags = map[string]func(string) bool{
	"container-runtime-endpoint": func(v string) bool { return v == containerdSocket },
	"node-ip":                    func(v string) bool { return net.ParseIP(v) != nil },
	"hostname-override":          isDNSName,
	"v":                          func(v string) bool { return len(v) == 1 && v[0] >= '0' && v[0] <= '9' },
	"register-with-taints": func(v string) bool {
		return v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._/=:,") == ""
	},
}

// checkKubeletFlags checks kubeadm-flags.env, which kubelet's unit reads
// as an environment file: exactly the one variable kubeadm writes, with
// only the flags it writes for Orrery's nodes. Another variable (the
// unit's KUBELET_CONFIG_ARGS, say) or flag (a credential provider, a
// configuration directory) would change what kubelet runs.
func checkKubeletFlags(b []byte) error {
	content := strings.TrimSuffix(string(b), "\n")
	const prefix = `KUBELET_KUBEADM_ARGS="`
	if strings.ContainsAny(content, "\n\r\\'$`") || !strings.HasPrefix(content, prefix) || !strings.HasSuffix(content, `"`) || len(content) < len(prefix)+1 {
		return fmt.Errorf("is not one line %s...\"", prefix)
	}
	args := strings.TrimSuffix(strings.TrimPrefix(content, prefix), `"`)
	if strings.Contains(args, `"`) {
		return fmt.Errorf("is not one line %s...\"", prefix)
	}
	seen := map[string]bool{}
	for _, a := range strings.Fields(args) {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		check, known := kubeletFlags[name]
		if !strings.HasPrefix(a, "--") || !ok || !known {
			return fmt.Errorf("gives kubelet %s; the node's gives only --%s", q(a), strings.Join(slices.Sorted(maps.Keys(kubeletFlags)), ", --"))
		}
		if seen[name] || !check(value) {
			return fmt.Errorf("gives kubelet %s, which is not a value the node writes", q(a))
		}
		seen[name] = true
	}
	return nil
}

func isDNSName(v string) bool {
	if v == "" || len(v) > 253 {
		return false
	}
	for _, label := range strings.Split(v, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		if strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return false
		}
	}
	return true
}
