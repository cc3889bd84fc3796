package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/orrery-dev/orrery/image/components/containerd/internal/containerdtest"
)

// TestSeedWithRealContainerd runs the containerd this module pins, links
// two baked images into it, and checks what the CRI plugin and a container
// start rely on: the image is complete and unpacked, its layer mounts
// (alone, and as an overlay lower directory) with the baked files, the
// garbage collector keeps it, a second run changes nothing, and an image
// no longer baked is deleted without touching the files it linked to.
func TestSeedWithRealContainerd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: containerd's overlayfs snapshotter mounts")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root := t.TempDir()
	bakedDir := filepath.Join(root, "baked")
	pause := writeBakedImage(t, bakedDir, "pause", "registry.k8s.io/pause:3.10.2", map[string]string{"pause": "#!/pause\n"})
	etcd := writeBakedImage(t, bakedDir, "etcd", "registry.k8s.io/etcd:3.6.8-0", map[string]string{"usr/local/bin/etcd": "etcd binary"})

	client, ctrdRoot := startContainerd(ctx, t, root)
	ctx = namespaces.WithNamespace(ctx, "k8s.io")
	cfg := config{ImagesDir: bakedDir, ContainerdRoot: ctrdRoot, Snapshotter: "overlayfs"}

	var out bytes.Buffer
	if err := seed(ctx, client, cfg, &out); err != nil {
		t.Fatalf("seed: %v\n%s", err, out.String())
	}
	t.Logf("first run:\n%s", out.String())
	if !strings.Contains(out.String(), "registry.k8s.io/pause:3.10.2: 3 blobs linked, layer linked, image recorded") {
		t.Errorf("first run did not link the pause image:\n%s", out.String())
	}
	for _, b := range []bakedImage{pause, etcd} {
		checkUsable(ctx, t, client, b)
	}

	out.Reset()
	if err := seed(ctx, client, cfg, &out); err != nil {
		t.Fatalf("second seed: %v", err)
	}
	if strings.Count(out.String(), "already available") != 2 || !strings.Contains(out.String(), "nothing on the state disk replaced") {
		t.Errorf("second run changed something:\n%s", out.String())
	}

	// The OS image of a later boot bakes no etcd.
	if err := os.Rename(etcd.Dir, filepath.Join(root, "etcd-gone")); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := seed(ctx, client, cfg, &out); err != nil {
		t.Fatalf("third seed: %v", err)
	}
	if !strings.Contains(out.String(), "registry.k8s.io/etcd:3.6.8-0: deleted") {
		t.Errorf("the image no longer baked was not deleted:\n%s", out.String())
	}
	if _, err := client.SnapshotService("overlayfs").Stat(ctx, etcd.ChainID); err == nil {
		t.Errorf("the garbage collector kept the deleted image's snapshot")
	}
	if _, err := os.Stat(filepath.Join(root, "etcd-gone", "rootfs", "usr/local/bin/etcd")); err != nil {
		t.Errorf("deleting the image removed the baked files it linked to: %v", err)
	}
	// The collection that dropped etcd kept pause.
	checkUsable(ctx, t, client, pause)
}

// TestSeedReplacesWhatIsNotBaked plays root on a node (a container escape)
// changing the state disk so that its change outlives a reboot: the
// kube-proxy layer's snapshot directory becomes a directory with another
// binary, its config blob a file of the same size with other bytes, and
// the flannel layer's snapshot is made again on top of another holding
// another flanneld. The next boot's seed puts back exactly the baked
// links, says what it replaced, and keeps working a container snapshot
// made on the layer before; the boot after replaces nothing.
func TestSeedReplacesWhatIsNotBaked(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: containerd's overlayfs snapshotter mounts")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root := t.TempDir()
	bakedDir := filepath.Join(root, "baked")
	e := &seedEnv{
		proxy:   writeBakedImage(t, bakedDir, "kube-proxy", "registry.k8s.io/kube-proxy:v1.35.0", map[string]string{"usr/local/bin/kube-proxy": "kube-proxy binary"}),
		flannel: writeBakedImage(t, bakedDir, "flannel", "ghcr.io/flannel-io/flannel:v0.27.4", map[string]string{"opt/bin/flanneld": "flanneld binary"}),
	}

	e.client, e.ctrdRoot = startContainerd(ctx, t, root)
	ctx = namespaces.WithNamespace(ctx, "k8s.io")
	e.cfg = config{ImagesDir: bakedDir, ContainerdRoot: e.ctrdRoot, Snapshotter: "overlayfs"}
	var out bytes.Buffer
	if err := seed(ctx, e.client, e.cfg, &out); err != nil {
		t.Fatalf("seed: %v\n%s", err, out.String())
	}
	e.sn = e.client.SnapshotService("overlayfs")
	// A container's snapshot from before the change: containerd will not
	// remove the layer under it.
	// The lease stands for the container record that keeps it from
	// containerd's garbage collector.
	const before = "container-before"
	leased, done, err := e.client.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	if _, err := e.sn.Prepare(leased, before, e.proxy.ChainID); err != nil {
		t.Fatal(err)
	}

	c := changeStateDisk(ctx, t, e)
	checkSeedPutsBackTheBakedLinks(ctx, t, e, c, before)
	checkSeedReplacesNothing(ctx, t, e)
}

// seedEnv is a containerd seeded with two baked images.
type seedEnv struct {
	client         *containerd.Client
	ctrdRoot       string
	cfg            config
	sn             snapshots.Snapshotter
	proxy, flannel bakedImage
}

// stateDiskChange is what changeStateDisk left in place of kube-proxy's
// baked links.
type stateDiskChange struct {
	layerDir    string // kube-proxy's layer snapshot directory
	configPath  string // kube-proxy's config blob in containerd's content store
	bakedConfig []byte
}

func changeStateDisk(ctx context.Context, t *testing.T, e *seedEnv) stateDiskChange {
	t.Helper()
	proxy := e.proxy
	// (a) A directory with another kube-proxy in place of the layer's link.
	layerDir := layerLink(t, e.ctrdRoot, proxy)
	if err := os.Remove(layerDir); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(layerDir, "usr/local/bin/kube-proxy"), "attacker's kube-proxy")
	// (b) A config of the same size with other bytes: containerd checks
	// only the size.
	configPath := contentPath(e.ctrdRoot, proxy.Config.Digest)
	bakedConfig, err := os.ReadFile(proxy.blob(proxy.Config.Digest))
	if err != nil {
		t.Fatal(err)
	}
	otherConfig := bytes.Replace(bakedConfig, []byte("linux"), []byte("xinul"), 1)
	if bytes.Equal(otherConfig, bakedConfig) {
		t.Fatal("the test's config has no \"linux\" to change")
	}
	if err := os.Remove(configPath); err != nil {
		t.Fatal(err)
	}
	writeFile(t, configPath, string(otherConfig))
	// (c) The flannel layer made again on top of a layer of the attacker's.
	stackUnder(ctx, t, e.client, e.flannel, "opt/bin/flanneld", "attacker's flanneld")
	return stateDiskChange{layerDir: layerDir, configPath: configPath, bakedConfig: bakedConfig}
}

func checkSeedPutsBackTheBakedLinks(ctx context.Context, t *testing.T, e *seedEnv, c stateDiskChange, before string) {
	t.Helper()
	proxy, flannel := e.proxy, e.flannel
	var out bytes.Buffer
	if err := seed(ctx, e.client, e.cfg, &out); err != nil {
		t.Fatalf("seed after the change: %v\n%s", err, out.String())
	}
	t.Logf("seed after the change:\n%s", out.String())
	for _, want := range []string{
		"registry.k8s.io/kube-proxy:v1.35.0: layer snapshot was not the baked layer (a directory); relinked",
		fmt.Sprintf("registry.k8s.io/kube-proxy:v1.35.0: config blob %s was not the baked blob (a regular file of %d bytes); relinked", proxy.Config.Digest, len(c.bakedConfig)),
		`ghcr.io/flannel-io/flannel:v0.27.4: layer snapshot was not the baked layer (it has a parent, "attacker"); re-made`,
		"replaced 3 things on the state disk that were not the baked images",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the seed's output does not say %q", want)
		}
	}
	if to, err := os.Readlink(c.layerDir); err != nil || to != proxy.rootfs() {
		t.Errorf("kube-proxy's layer directory links to %q (%v), want %q", to, err, proxy.rootfs())
	}
	if to, err := os.Readlink(c.configPath); err != nil || to != proxy.blob(proxy.Config.Digest) {
		t.Errorf("kube-proxy's config blob links to %q (%v), want %q", to, err, proxy.blob(proxy.Config.Digest))
	}
	if got, err := content.ReadBlob(ctx, e.client.ContentStore(), proxy.Config); err != nil || !bytes.Equal(got, c.bakedConfig) {
		t.Errorf("containerd reads kube-proxy's config as %q (%v), want the baked %q", got, err, c.bakedConfig)
	}
	if info, err := e.sn.Stat(ctx, flannel.ChainID); err != nil || info.Parent != "" {
		t.Errorf("flannel's layer snapshot: %+v, %v; want one without a parent", info, err)
	}
	for _, b := range []bakedImage{proxy, flannel} {
		checkUsable(ctx, t, e.client, b)
	}
	if got := readInSnapshot(ctx, t, e.sn, before, "usr/local/bin/kube-proxy"); got != "kube-proxy binary" {
		t.Errorf("the container from before the change sees kube-proxy as %q, want the baked one", got)
	}
}

func checkSeedReplacesNothing(ctx context.Context, t *testing.T, e *seedEnv) {
	t.Helper()
	var out bytes.Buffer
	if err := seed(ctx, e.client, e.cfg, &out); err != nil {
		t.Fatalf("seed with nothing changed: %v", err)
	}
	if strings.Count(out.String(), "already available") != 2 || !strings.Contains(out.String(), "nothing on the state disk replaced") {
		t.Errorf("a seed with nothing changed replaced something, or did not say it replaced nothing:\n%s", out.String())
	}
}

// layerLink returns the path of b's layer snapshot directory, found as the
// one symlink to b's rootfs among the overlayfs snapshotter's directories
// (not the way seed finds it).
func layerLink(t *testing.T, ctrdRoot string, b bakedImage) string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(ctrdRoot, "io.containerd.snapshotter.v1.overlayfs", "snapshots", "*", "fs"))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, p := range paths {
		if to, err := os.Readlink(p); err == nil && to == b.rootfs() {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d snapshot directories link to the rootfs, want 1: %v", b.Name, len(found), found)
	}
	return found[0]
}

func contentPath(ctrdRoot string, d digest.Digest) string {
	return filepath.Join(ctrdRoot, "io.containerd.content.v1.content", "blobs", d.Algorithm().String(), d.Encoded())
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o755); err != nil {
		t.Fatal(err)
	}
}

// stackUnder makes b's layer snapshot again, empty, on top of a snapshot
// named "attacker" that holds data at rel: a container from the image then
// sees the attacker's file where the baked layer has the same one.
func stackUnder(ctx context.Context, t *testing.T, client *containerd.Client, b bakedImage, rel, data string) {
	t.Helper()
	ctx, done, err := client.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	sn := client.SnapshotService("overlayfs")
	if err := sn.Remove(ctx, b.ChainID); err != nil {
		t.Fatal(err)
	}
	mounts, err := sn.Prepare(ctx, "attacker-active", "")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mounts[0].Source, rel), data)
	if err := sn.Commit(ctx, "attacker", "attacker-active"); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "attacker-top", "attacker"); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, b.ChainID, "attacker-top"); err != nil {
		t.Fatal(err)
	}
}

// readInSnapshot mounts the active snapshot key and reads rel in it.
func readInSnapshot(ctx context.Context, t *testing.T, sn snapshots.Snapshotter, key, rel string) string {
	t.Helper()
	mounts, err := sn.Mounts(ctx, key)
	if err != nil {
		t.Fatalf("mounts of %s: %v", key, err)
	}
	target := t.TempDir()
	if err := mount.All(mounts, target); err != nil {
		t.Fatalf("mount %s: %v", key, err)
	}
	defer func() { _ = mount.UnmountAll(target, 0) }()
	data, err := os.ReadFile(filepath.Join(target, rel))
	if err != nil {
		t.Errorf("read %s in %s: %v", rel, key, err)
	}
	return string(data)
}

// checkUsable checks b the way kubelet's image status and a container
// start use it.
func checkUsable(ctx context.Context, t *testing.T, client *containerd.Client, b bakedImage) {
	t.Helper()
	img, err := client.GetImage(ctx, b.Name)
	if err != nil {
		t.Fatalf("%s: %v", b.Name, err)
	}
	if img.Labels()[labelPinned] != "pinned" {
		t.Errorf("%s is not pinned: %v", b.Name, img.Labels())
	}
	ok, _, _, missing, err := images.Check(ctx, client.ContentStore(), img.Target(), platforms.Default())
	if err != nil || !ok {
		t.Errorf("%s: content not complete (the CRI plugin skips such images at start): missing %v, err %v", b.Name, missing, err)
	}
	unpacked, err := img.IsUnpacked(ctx, "overlayfs")
	if err != nil || !unpacked {
		t.Errorf("%s: not unpacked: %v", b.Name, err)
	}
	// A container's root: an overlay with the layer as lower directory.
	sn := client.SnapshotService("overlayfs")
	key := "container-" + b.Name
	mounts, err := sn.Prepare(ctx, key, b.ChainID)
	if err != nil {
		t.Fatalf("%s: prepare a container snapshot: %v", b.Name, err)
	}
	defer func() { _ = sn.Remove(ctx, key) }()
	target := t.TempDir()
	if err := mount.All(mounts, target); err != nil {
		t.Fatalf("%s: mount %+v: %v", b.Name, mounts, err)
	}
	defer func() { _ = mount.UnmountAll(target, 0) }()
	err = filepath.Walk(b.rootfs(), func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(b.rootfs(), p)
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join(target, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %s in the container's root: %q, %v; want %q", b.Name, rel, got, err, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Writes go to the container's own upper directory.
	if err := os.WriteFile(filepath.Join(target, "written"), []byte("x"), 0o644); err != nil {
		t.Errorf("%s: write in the container's root: %v", b.Name, err)
	}
	if _, err := os.Stat(filepath.Join(b.rootfs(), "written")); err == nil {
		t.Errorf("%s: a container's write reached the baked layer", b.Name)
	}
}

// writeBakedImage writes, under dir/name, what the image build leaves on
// the root: an OCI layout of one single-layer image, and the layer
// unpacked in rootfs/.
func writeBakedImage(t *testing.T, dir, name, ref string, files map[string]string) bakedImage {
	t.Helper()
	b := bakedImage{Name: ref, Dir: filepath.Join(dir, name)}
	var layerTar, layerGz bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	for p, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: p, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(b.rootfs(), p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	gz := gzip.NewWriter(&layerGz)
	if _, err := gz.Write(layerTar.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	blob := func(mediaType string, data []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
		p := b.blob(d.Digest)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	mustJSON := func(v any) []byte {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	b.Layer = blob(ocispec.MediaTypeImageLayerGzip, layerGz.Bytes())
	b.ChainID = digest.FromBytes(layerTar.Bytes()).String()
	b.Config = blob(ocispec.MediaTypeImageConfig, mustJSON(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(b.ChainID)}},
	}))
	manifest := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: b.Config, Layers: []ocispec.Descriptor{b.Layer}}
	manifest.SchemaVersion = 2
	b.Manifest = blob(ocispec.MediaTypeImageManifest, mustJSON(manifest))
	index := ocispec.Index{Manifests: []ocispec.Descriptor{b.Manifest}}
	index.SchemaVersion = 2
	index.Manifests[0].Annotations = map[string]string{images.AnnotationImageName: ref}
	if err := os.WriteFile(filepath.Join(b.Dir, "index.json"), mustJSON(index), 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// startContainerd builds the pinned containerd and runs it on a root and
// socket of the test's own, without the CRI plugin (nothing here needs a
// runtime). It returns a client and containerd's root.
func startContainerd(ctx context.Context, t *testing.T, dir string) (*containerd.Client, string) {
	t.Helper()
	bin := containerdtest.Build(ctx, t, dir)
	ctrdRoot, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	sock := filepath.Join(dir, "containerd.sock")
	conf := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.sandbox.controller.v1.shim"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, ctrdRoot, state, sock, sock+".ttrpc")
	confPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--config", confPath)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		// Snapshots the test left mounted would keep the temporary
		// directory from being removed.
		_ = mount.UnmountRecursive(dir, 0)
		if t.Failed() {
			t.Logf("containerd's log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		client, err := containerd.New(sock, containerd.WithTimeout(5*time.Second))
		if err == nil {
			if serving, err := client.IsServing(ctx); err == nil && serving {
				return client, ctrdRoot
			}
			client.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not start: %v\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
