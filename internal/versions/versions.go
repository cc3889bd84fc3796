// Package versions says which Kubernetes versions an Orrery image supports
// and, for each, exactly which upstream components it carries: binaries with
// their sha256 digests and install paths, container images with their
// references and digests, and the etcd, CoreDNS and pause versions kubeadm
// expects.
//
// The data is the manifest image/components/build.sh writes, committed here
// as versions_<kubernetes version>.json and embedded. To support another
// Kubernetes version, build its components (see image/components/README.md)
// and commit the new file: nothing else in this package changes.
package versions

import (
	"cmp"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Default is the Kubernetes version used when the owner names none: the
// newest the image carries.
var Default = newest()

//go:embed versions_*.json
var data embed.FS

// Release is everything an image carries for one Kubernetes version.
type Release struct {
	KubernetesVersion string `json:"kubernetesVersion"` // e.g. "v1.36.3"
	EtcdVersion       string `json:"etcdVersion"`       // image tag kubeadm expects, e.g. "3.6.8-0"
	CoreDNSVersion    string `json:"corednsVersion"`    // image tag, e.g. "v1.14.2"
	PauseVersion      string `json:"pauseVersion"`      // image tag, e.g. "3.10.2"
	FlannelVersion    string `json:"flannelVersion"`
	ContainerdVersion string `json:"containerdVersion"`
	RuncVersion       string `json:"runcVersion"`
	CNIPluginsVersion string `json:"cniPluginsVersion"`
	// GoVersion is the toolchain that built the binaries; digests hold only
	// for builds with the same toolchain.
	GoVersion string `json:"goVersion"`
	// HostPackages are the Debian packages (name to version) whose files went
	// into the build: runc links libc and libseccomp statically, and the
	// kube-proxy and flannel images carry iptables and nft.
	HostPackages map[string]string `json:"hostPackages"`
	// PinLabel is the containerd image label ("key=value") that keeps an
	// image from kubelet's image garbage collection; the node sets it on every
	// image whose Pinned is true after importing it.
	PinLabel string   `json:"pinLabel"`
	Binaries []Binary `json:"binaries"`
	Images   []Image  `json:"images"`
}

// Binary is a program installed on the node's root filesystem.
type Binary struct {
	Name        string `json:"name"`        // e.g. "kubeadm"
	Version     string `json:"version"`     // upstream version
	Module      string `json:"module"`      // Go module it is built from
	Path        string `json:"path"`        // relative to the components build directory
	InstallPath string `json:"installPath"` // absolute path on the node
	SHA256      string `json:"sha256"`      // hex
	Size        int64  `json:"size"`
}

// Image is a container image the node runs. The components build writes it
// as an archive; the OS image carries it unpacked (see orrery-images in
// image/components/containerd).
type Image struct {
	Name         string `json:"name"`         // e.g. "kube-apiserver"
	Version      string `json:"version"`      // upstream version of the program in it
	Ref          string `json:"ref"`          // e.g. "registry.k8s.io/kube-apiserver:v1.36.3"
	Path         string `json:"path"`         // archive, relative to the components build directory
	InstallPath  string `json:"installPath"`  // absolute path on the node of its OCI layout and unpacked rootfs/
	SHA256       string `json:"sha256"`       // hex, of the archive
	Size         int64  `json:"size"`         // of the archive
	Digest       string `json:"digest"`       // manifest digest, "sha256:..."
	ConfigDigest string `json:"configDigest"` // image ID, "sha256:..."
	Pinned       bool   `json:"pinned"`       // exempt from kubelet's image GC
}

// UnsupportedError is returned for a Kubernetes version the image does not
// carry.
type UnsupportedError struct {
	Version   string
	Supported []string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("Kubernetes %s is not supported by this image; supported: %s",
		e.Version, strings.Join(e.Supported, ", "))
}

// Binary returns the binary called name.
func (r Release) Binary(name string) (Binary, bool) {
	i := slices.IndexFunc(r.Binaries, func(b Binary) bool { return b.Name == name })
	if i < 0 {
		return Binary{}, false
	}
	return r.Binaries[i], true
}

// Image returns the image called name (e.g. "etcd").
func (r Release) Image(name string) (Image, bool) {
	i := slices.IndexFunc(r.Images, func(im Image) bool { return im.Name == name })
	if i < 0 {
		return Image{}, false
	}
	return r.Images[i], true
}

// PinnedImages returns the references of the images that must be pinned.
func (r Release) PinnedImages() []string {
	var refs []string
	for _, im := range r.Images {
		if im.Pinned {
			refs = append(refs, im.Ref)
		}
	}
	return refs
}

// List returns the supported Kubernetes versions, oldest first.
func List() []string {
	rs, err := load()
	if err != nil {
		return nil
	}
	vs := make([]string, 0, len(rs))
	for v := range rs {
		vs = append(vs, v)
	}
	slices.SortFunc(vs, Compare)
	return vs
}

// Compare orders two vMAJOR.MINOR.PATCH versions by number: v1.9.0
// before v1.10.0. A version that is not one sorts first.
func Compare(a, b string) int {
	pa, pb := parts(a), parts(b)
	for i := range pa {
		if c := cmp.Compare(pa[i], pb[i]); c != 0 {
			return c
		}
	}
	return strings.Compare(a, b)
}

// parts is v's major, minor and patch, or -1s if v is not vX.Y.Z.
func parts(v string) [3]int {
	p := [3]int{-1, -1, -1}
	if !semver.MatchString(v) {
		return p
	}
	for i, f := range strings.SplitN(v[1:], ".", 3) {
		p[i], _ = strconv.Atoi(f)
	}
	return p
}

// Resolve returns the full version the image carries for v: v itself
// ("v1.37.2"), or for a minor alone ("v1.37") the newest patch of it the
// image carries. The leading "v" may be left out. A version the image
// does not carry is an *UnsupportedError.
func Resolve(v string) (string, error) {
	norm := "v" + strings.TrimPrefix(v, "v")
	if !minorOnly.MatchString(norm) {
		r, err := Get(norm)
		if err != nil {
			return "", &UnsupportedError{Version: v, Supported: List()}
		}
		return r.KubernetesVersion, nil
	}
	var found string
	for _, full := range List() {
		if strings.HasPrefix(full, norm+".") {
			found = full // List is sorted oldest first
		}
	}
	if found == "" {
		return "", &UnsupportedError{Version: v, Supported: List()}
	}
	return found, nil
}

// Minor is the minor of version v: "v1.37" of "v1.37.2"; v itself if it
// names no patch.
func Minor(v string) string {
	if i := strings.LastIndex(v, "."); strings.Count(v, ".") == 2 && i > 0 {
		return v[:i]
	}
	return v
}

var minorOnly = regexp.MustCompile(`^v\d+\.\d+$`)

// newest is the newest version the image carries, "" if none.
func newest() string {
	vs := List()
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// Supported returns nil if the image carries Kubernetes version v, and an
// *UnsupportedError naming the supported versions otherwise.
func Supported(v string) error {
	_, err := Get(v)
	return err
}

// Get returns the release for Kubernetes version v ("v1.36.3"; the leading
// "v" may be left out).
func Get(v string) (Release, error) {
	rs, err := load()
	if err != nil {
		return Release{}, err
	}
	norm := v
	if !strings.HasPrefix(norm, "v") {
		norm = "v" + norm
	}
	r, ok := rs[norm]
	if !ok {
		return Release{}, &UnsupportedError{Version: v, Supported: List()}
	}
	return r, nil
}

var load = sync.OnceValues(func() (map[string]Release, error) { return parse(data) })

// parse reads and checks every versions_*.json file in fsys.
func parse(fsys fs.FS) (map[string]Release, error) {
	files, err := fs.Glob(fsys, "versions_*.json")
	if err != nil {
		return nil, err
	}
	rs := map[string]Release{}
	for _, f := range files {
		raw, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		var r Release
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("versions: %s: %w", f, err)
		}
		if want := strings.TrimSuffix(strings.TrimPrefix(f, "versions_"), ".json"); r.KubernetesVersion != want {
			return nil, fmt.Errorf("versions: %s: kubernetesVersion is %q, want %q", f, r.KubernetesVersion, want)
		}
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("versions: %s: %w", f, err)
		}
		rs[r.KubernetesVersion] = r
	}
	return rs, nil
}

var (
	hexSHA256    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	digestSHA256 = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	semver       = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
)

// Binaries and images every release must have.
var (
	requiredBinaries = []string{"kubeadm", "kubelet", "kubectl", "containerd", "containerd-shim-runc-v2", "ctr", "runc",
		"bridge", "host-local", "loopback", "portmap"}
	requiredImages = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "coredns", "pause"}
)

// validate checks that r is complete and consistent: versions are set, every
// required binary and image is present once, digests are well-formed, paths
// are relative (build) and absolute (node), and the image references are the
// ones kubeadm of this version pulls.
func (r Release) validate() error {
	if !semver.MatchString(r.KubernetesVersion) {
		return fmt.Errorf("kubernetesVersion %q is not vMAJOR.MINOR.PATCH", r.KubernetesVersion)
	}
	for name, v := range map[string]string{"etcdVersion": r.EtcdVersion, "corednsVersion": r.CoreDNSVersion,
		"pauseVersion": r.PauseVersion, "goVersion": r.GoVersion, "pinLabel": r.PinLabel} {
		if v == "" {
			return fmt.Errorf("%s is empty", name)
		}
	}
	if k, v, ok := strings.Cut(r.PinLabel, "="); !ok || k == "" || v == "" {
		return fmt.Errorf("pinLabel %q is not key=value", r.PinLabel)
	}
	seen := map[string]bool{}
	for _, b := range r.Binaries {
		if seen[b.Name] {
			return fmt.Errorf("binary %q listed twice", b.Name)
		}
		seen[b.Name] = true
		if err := checkFile(b.Name, b.Version, b.Path, b.InstallPath, b.SHA256, b.Size); err != nil {
			return fmt.Errorf("binary %w", err)
		}
	}
	for _, name := range requiredBinaries {
		if !seen[name] {
			return fmt.Errorf("binary %q missing", name)
		}
	}
	seen = map[string]bool{}
	for _, im := range r.Images {
		if seen[im.Name] {
			return fmt.Errorf("image %q listed twice", im.Name)
		}
		seen[im.Name] = true
		if err := checkFile(im.Name, im.Version, im.Path, im.InstallPath, im.SHA256, im.Size); err != nil {
			return fmt.Errorf("image %w", err)
		}
		if !digestSHA256.MatchString(im.Digest) || !digestSHA256.MatchString(im.ConfigDigest) {
			return fmt.Errorf("image %q: digest %q or config digest %q is not sha256:<hex>", im.Name, im.Digest, im.ConfigDigest)
		}
	}
	for _, name := range requiredImages {
		if !seen[name] {
			return fmt.Errorf("image %q missing", name)
		}
	}
	want := map[string]string{
		"kube-apiserver":          "registry.k8s.io/kube-apiserver:" + r.KubernetesVersion,
		"kube-controller-manager": "registry.k8s.io/kube-controller-manager:" + r.KubernetesVersion,
		"kube-scheduler":          "registry.k8s.io/kube-scheduler:" + r.KubernetesVersion,
		"kube-proxy":              "registry.k8s.io/kube-proxy:" + r.KubernetesVersion,
		"etcd":                    "registry.k8s.io/etcd:" + r.EtcdVersion,
		"coredns":                 "registry.k8s.io/coredns/coredns:" + r.CoreDNSVersion,
		"pause":                   "registry.k8s.io/pause:" + r.PauseVersion,
	}
	for name, ref := range want {
		if im, _ := r.Image(name); im.Ref != ref {
			return fmt.Errorf("image %q: ref %q, kubeadm expects %q", name, im.Ref, ref)
		}
	}
	return nil
}

func checkFile(name, version, rel, install, sum string, size int64) error {
	switch {
	case name == "" || version == "":
		return fmt.Errorf("%q: name or version empty", name)
	case rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || strings.HasPrefix(rel, ".."):
		return fmt.Errorf("%q: path %q is not a clean relative path", name, rel)
	case !path.IsAbs(install) || path.Clean(install) != install:
		return fmt.Errorf("%q: installPath %q is not a clean absolute path", name, install)
	case !hexSHA256.MatchString(sum):
		return fmt.Errorf("%q: sha256 %q is not 64 hex digits", name, sum)
	case size <= 0:
		return fmt.Errorf("%q: size %d", name, size)
	}
	return nil
}
