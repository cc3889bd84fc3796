package versions

import (
	"cmp"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
)

func TestEmbeddedDataIsWellFormed(t *testing.T) {
	rs, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) == 0 {
		t.Fatal("no versions_*.json embedded")
	}
	for v, r := range rs {
		for _, name := range requiredImages {
			im, _ := r.Image(name)
			if !im.Pinned {
				t.Errorf("%s: image %s is not pinned: kubelet's image GC could remove it and the node has no registry", v, name)
			}
		}
	}
}

func TestDefaultIsSupported(t *testing.T) {
	if err := Supported(Default); err != nil {
		t.Fatal(err)
	}
	r, err := Get(Default)
	if err != nil {
		t.Fatal(err)
	}
	if r.KubernetesVersion != Default {
		t.Errorf("Get(%q).KubernetesVersion = %q", Default, r.KubernetesVersion)
	}
	if b, ok := r.Binary("kubeadm"); !ok || b.Version != Default {
		t.Errorf("kubeadm = %+v, %v; want version %s", b, ok, Default)
	}
}

func TestGet(t *testing.T) {
	supported := strings.Join(List(), ", ")
	testCases := map[string]struct {
		version string
		wantErr string
	}{
		"default":                {version: Default},
		"without v":              {version: strings.TrimPrefix(Default, "v")},
		"older minor":            {version: "v1.35.0", wantErr: "Kubernetes v1.35.0 is not supported by this image; supported: " + supported},
		"empty":                  {version: "", wantErr: "Kubernetes  is not supported by this image; supported: " + supported},
		"garbage":                {version: "latest", wantErr: "Kubernetes latest is not supported by this image; supported: " + supported},
		"release candidate":      {version: Default + "-rc.1", wantErr: "is not supported"},
		"other patch same minor": {version: "v1.36.0", wantErr: "Kubernetes v1.36.0 is not supported"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := Get(tc.version)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Get(%q): %v", tc.version, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Get(%q) error = %v, want %q", tc.version, err, tc.wantErr)
			}
			var ue *UnsupportedError
			if !errors.As(err, &ue) {
				t.Fatalf("Get(%q) error is %T, want *UnsupportedError", tc.version, err)
			}
			if Supported(tc.version) == nil {
				t.Fatalf("Supported(%q) = nil", tc.version)
			}
		})
	}
}

func TestUnsupportedMessage(t *testing.T) {
	err := &UnsupportedError{Version: "v1.35.0", Supported: []string{"v1.36.3"}}
	if got, want := err.Error(), "Kubernetes v1.35.0 is not supported by this image; supported: v1.36.3"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// validRelease returns a small release that passes validate.
func validRelease() Release {
	sum := strings.Repeat("a", 64)
	r := Release{
		KubernetesVersion: "v1.99.0", EtcdVersion: "3.9.0-0", CoreDNSVersion: "v1.20.0", PauseVersion: "3.20",
		GoVersion: "go1.26.0", PinLabel: "io.cri-containerd.pinned=pinned",
	}
	for _, n := range requiredBinaries {
		r.Binaries = append(r.Binaries, Binary{Name: n, Version: "v1", Module: "example.com/m", Path: "bin/" + n, InstallPath: "/usr/bin/" + n, SHA256: sum, Size: 1})
	}
	refs := map[string]string{"etcd": "registry.k8s.io/etcd:3.9.0-0", "coredns": "registry.k8s.io/coredns/coredns:v1.20.0", "pause": "registry.k8s.io/pause:3.20"}
	for _, n := range requiredImages {
		ref := refs[n]
		if ref == "" {
			ref = "registry.k8s.io/" + n + ":v1.99.0"
		}
		r.Images = append(r.Images, Image{Name: n, Version: "v1", Ref: ref, Path: "images/" + n + ".tar", InstallPath: "/usr/share/orrery/images/" + n,
			SHA256: sum, Size: 1, Digest: "sha256:" + sum, ConfigDigest: "sha256:" + sum, Pinned: true})
	}
	return r
}

func TestParse(t *testing.T) {
	testCases := map[string]struct {
		file    string
		edit    func(*Release)
		raw     string
		wantErr string
	}{
		"valid":              {file: "versions_v1.99.0.json"},
		"name mismatch":      {file: "versions_v1.98.0.json", wantErr: `kubernetesVersion is "v1.99.0", want "v1.98.0"`},
		"unknown field":      {file: "versions_v1.99.0.json", raw: `{"kubernetesVersion":"v1.99.0","surprise":1}`, wantErr: "unknown field"},
		"not json":           {file: "versions_v1.99.0.json", raw: `{`, wantErr: "unexpected EOF"},
		"missing kubeadm":    {file: "versions_v1.99.0.json", edit: func(r *Release) { r.Binaries = r.Binaries[1:] }, wantErr: `binary "kubeadm" missing`},
		"duplicate binary":   {file: "versions_v1.99.0.json", edit: func(r *Release) { r.Binaries = append(r.Binaries, r.Binaries[0]) }, wantErr: "listed twice"},
		"bad sha256":         {file: "versions_v1.99.0.json", edit: func(r *Release) { r.Binaries[0].SHA256 = "xyz" }, wantErr: "not 64 hex digits"},
		"relative install":   {file: "versions_v1.99.0.json", edit: func(r *Release) { r.Binaries[0].InstallPath = "usr/bin/kubeadm" }, wantErr: "not a clean absolute path"},
		"escaping path":      {file: "versions_v1.99.0.json", edit: func(r *Release) { r.Images[0].Path = "../x.tar" }, wantErr: "not a clean relative path"},
		"bad digest":         {file: "versions_v1.99.0.json", edit: func(r *Release) { r.Images[0].Digest = "md5:1" }, wantErr: "not sha256:<hex>"},
		"wrong etcd tag":     {file: "versions_v1.99.0.json", edit: func(r *Release) { r.EtcdVersion = "3.9.1-0" }, wantErr: `kubeadm expects "registry.k8s.io/etcd:3.9.1-0"`},
		"missing pause":      {file: "versions_v1.99.0.json", edit: func(r *Release) { r.Images = r.Images[:len(r.Images)-1] }, wantErr: `image "pause" missing`},
		"bad pin label":      {file: "versions_v1.99.0.json", edit: func(r *Release) { r.PinLabel = "pinned" }, wantErr: "not key=value"},
		"bad version format": {file: "versions_1.99.json", edit: func(r *Release) { r.KubernetesVersion = "1.99" }, wantErr: "not vMAJOR.MINOR.PATCH"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			raw := []byte(tc.raw)
			if tc.raw == "" {
				r := validRelease()
				if tc.edit != nil {
					tc.edit(&r)
				}
				var err error
				if raw, err = json.Marshal(r); err != nil {
					t.Fatal(err)
				}
			}
			_, err := parse(fstest.MapFS{tc.file: {Data: raw}})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parse error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// The image carries two Kubernetes minors, so that a cluster can move
// from the older to the newer in place.
func TestImageCarriesTwoMinors(t *testing.T) {
	minors := map[string]bool{}
	for _, v := range List() {
		minors[Minor(v)] = true
	}
	if len(minors) < 2 {
		t.Fatalf("the image carries %v: want two minors, for an in-place upgrade", List())
	}
}

func TestDefaultIsTheNewest(t *testing.T) {
	vs := List()
	if Default != vs[len(vs)-1] {
		t.Errorf("Default = %s, want the newest of %v", Default, vs)
	}
}

func TestResolve(t *testing.T) {
	vs := List()
	newestOf := map[string]string{}
	for _, v := range vs {
		newestOf[Minor(v)] = v // List is oldest first
	}
	for _, v := range vs {
		for _, in := range []string{v, strings.TrimPrefix(v, "v")} {
			if got, err := Resolve(in); err != nil || got != v {
				t.Errorf("Resolve(%q) = %q, %v; want %s", in, got, err, v)
			}
		}
		for _, in := range []string{Minor(v), strings.TrimPrefix(Minor(v), "v")} {
			if got, err := Resolve(in); err != nil || got != newestOf[Minor(v)] {
				t.Errorf("Resolve(%q) = %q, %v; want the minor's newest patch %s", in, got, err, newestOf[Minor(v)])
			}
		}
	}
	supported := strings.Join(vs, ", ")
	for _, in := range []string{"v1.20", "v1.20.0", "v1", "1", "", "latest", "v1.37.x", Default + "-rc.1", "v" + Default, "stable-1.37", "v1.36.", "v1.36.3.1"} {
		got, err := Resolve(in)
		var ue *UnsupportedError
		if !errors.As(err, &ue) {
			t.Errorf("Resolve(%q) = %q, %v; want an *UnsupportedError", in, got, err)
			continue
		}
		if want := "Kubernetes " + in + " is not supported by this image; supported: " + supported; err.Error() != want {
			t.Errorf("Resolve(%q): %q, want %q", in, err, want)
		}
	}
}

func TestCompare(t *testing.T) {
	ordered := []string{"latest", "v1.9.0", "v1.9.10", "v1.10.0", "v1.36.3", "v1.37.2", "v2.0.0"}
	for i := range ordered {
		for j := range ordered {
			if got, want := Compare(ordered[i], ordered[j]), cmp.Compare(i, j); got != want {
				t.Errorf("Compare(%s, %s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
}

func TestMinor(t *testing.T) {
	for in, want := range map[string]string{"v1.37.2": "v1.37", "1.36.3": "1.36", "v1.37": "v1.37", "latest": "latest", "": ""} {
		if got := Minor(in); got != want {
			t.Errorf("Minor(%q) = %q, want %q", in, got, want)
		}
	}
}
