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
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
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
	if strings.Count(out.String(), "already available") != 2 {
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
