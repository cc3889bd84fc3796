package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Labels this program sets. The pinned label is the CRI plugin's: kubelet's
// image garbage collection never removes a pinned image.
const (
	labelBaked  = "orrery.dev/baked"
	labelRootfs = "orrery.dev/rootfs"
	labelPinned = "io.cri-containerd.pinned"
	labelCRI    = "io.cri-containerd.image"
)

type config struct {
	ImagesDir      string
	ContainerdRoot string
	Snapshotter    string
}

// bakedImage is one image as the image build left it on the root.
type bakedImage struct {
	Name     string // containerd's image name, e.g. registry.k8s.io/pause:3.10.2
	Dir      string // its OCI image layout
	Manifest ocispec.Descriptor
	Config   ocispec.Descriptor
	Layer    ocispec.Descriptor
	ChainID  string // of its one layer: the layer's diff ID
}

func (b bakedImage) blob(d digest.Digest) string {
	return filepath.Join(b.Dir, "blobs", d.Algorithm().String(), d.Encoded())
}

func (b bakedImage) rootfs() string { return filepath.Join(b.Dir, "rootfs") }

// seed makes every baked image under cfg.ImagesDir available in the
// client's namespace, then deletes the images an earlier boot baked that
// are gone from the directory.
func seed(ctx context.Context, client *containerd.Client, cfg config, out io.Writer) error {
	if cfg.Snapshotter != "overlayfs" {
		return fmt.Errorf("snapshotter %q: only overlayfs is supported (the baked layers are linked as overlayfs lower directories)", cfg.Snapshotter)
	}
	baked, err := readBakedImages(cfg.ImagesDir)
	if err != nil {
		return err
	}
	// The lease keeps containerd's garbage collector off what is linked
	// here until the image records that reference it exist.
	ctx, done, err := client.WithLease(ctx)
	if err != nil {
		return fmt.Errorf("take a containerd lease: %w", err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()

	start := time.Now()
	keep := map[string]bool{}
	for _, b := range baked {
		t0 := time.Now()
		what, err := seedImage(ctx, client, cfg, b)
		if err != nil {
			return fmt.Errorf("image %s: %w", b.Name, err)
		}
		keep[b.Name] = true
		fmt.Fprintf(out, "%s: %s (%s)\n", b.Name, what, time.Since(t0).Round(time.Millisecond))
	}
	if err := deleteStale(ctx, client, keep, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d baked images available in %s\n", len(baked), time.Since(start).Round(time.Millisecond))
	return nil
}

// readBakedImages reads and checks every layout under dir, sorted by name.
func readBakedImages(dir string) ([]bakedImage, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the baked images: %w", err)
	}
	var out []bakedImage
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		b, err := readBakedImage(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("baked image %s: %w (rebuild the OS image: make image)", e.Name(), err)
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no baked images in %s (rebuild the OS image: make image)", dir)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// readBakedImage reads an OCI image layout of one manifest with one layer,
// checking the manifest's and config's digests (they are small; the layer
// is not hashed here, dm-verity checks it as it is read).
func readBakedImage(dir string) (bakedImage, error) {
	b := bakedImage{Dir: dir}
	var index ocispec.Index
	if err := readJSON(filepath.Join(dir, "index.json"), &index); err != nil {
		return b, err
	}
	if len(index.Manifests) != 1 {
		return b, fmt.Errorf("index.json lists %d manifests, want 1", len(index.Manifests))
	}
	b.Manifest = index.Manifests[0]
	b.Name = b.Manifest.Annotations[images.AnnotationImageName]
	if b.Name == "" {
		return b, fmt.Errorf("index.json names no image (annotation %s)", images.AnnotationImageName)
	}
	b.Manifest.Annotations = nil
	var manifest ocispec.Manifest
	if err := readBlobJSON(b, b.Manifest, &manifest); err != nil {
		return b, err
	}
	if len(manifest.Layers) != 1 {
		return b, fmt.Errorf("manifest has %d layers, want 1", len(manifest.Layers))
	}
	b.Config, b.Layer = manifest.Config, manifest.Layers[0]
	var cfg ocispec.Image
	if err := readBlobJSON(b, b.Config, &cfg); err != nil {
		return b, err
	}
	if len(cfg.RootFS.DiffIDs) != 1 {
		return b, fmt.Errorf("config has %d diff IDs, want 1", len(cfg.RootFS.DiffIDs))
	}
	// The chain ID of a single layer is its diff ID.
	if err := cfg.RootFS.DiffIDs[0].Validate(); err != nil {
		return b, fmt.Errorf("config's diff ID: %w", err)
	}
	b.ChainID = cfg.RootFS.DiffIDs[0].String()
	if st, err := os.Stat(b.blob(b.Layer.Digest)); err != nil {
		return b, fmt.Errorf("layer blob: %w", err)
	} else if st.Size() != b.Layer.Size {
		return b, fmt.Errorf("layer blob is %d bytes, the manifest says %d", st.Size(), b.Layer.Size)
	}
	if st, err := os.Stat(b.rootfs()); err != nil || !st.IsDir() {
		return b, fmt.Errorf("no unpacked layer at %s", b.rootfs())
	}
	return b, nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func readBlobJSON(b bakedImage, d ocispec.Descriptor, v any) error {
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("descriptor %q: %w", d.Digest, err)
	}
	data, err := os.ReadFile(b.blob(d.Digest))
	if err != nil {
		return err
	}
	if int64(len(data)) != d.Size || d.Digest.Algorithm().FromBytes(data) != d.Digest {
		return fmt.Errorf("blob %s does not match its descriptor", d.Digest)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	return nil
}

// seedImage links one image's blobs and layer and records the image. It
// returns what it did, for the journal.
func seedImage(ctx context.Context, client *containerd.Client, cfg config, b bakedImage) (string, error) {
	var did []string
	blobs := []struct {
		desc   ocispec.Descriptor
		labels map[string]string
	}{
		{b.Layer, nil},
		{b.Config, map[string]string{"containerd.io/gc.ref.snapshot." + cfg.Snapshotter: b.ChainID}},
		{b.Manifest, map[string]string{
			"containerd.io/gc.ref.content.config": b.Config.Digest.String(),
			"containerd.io/gc.ref.content.l.0":    b.Layer.Digest.String(),
		}},
	}
	linked := 0
	for _, bl := range blobs {
		n, err := linkBlob(ctx, client.ContentStore(), cfg, b, bl.desc, bl.labels)
		if err != nil {
			return "", err
		}
		linked += n
	}
	if linked > 0 {
		did = append(did, fmt.Sprintf("%d blobs linked", linked))
	}
	made, err := linkSnapshot(ctx, client.SnapshotService(cfg.Snapshotter), b)
	if err != nil {
		return "", err
	}
	if made {
		did = append(did, "layer linked")
	}
	what, err := recordImage(ctx, client.ImageService(), b)
	if err != nil {
		return "", err
	}
	if what != "" {
		did = append(did, what)
	}
	if len(did) == 0 {
		return "already available", nil
	}
	return strings.Join(did, ", "), nil
}

// linkBlob makes desc's blob, on the root, a blob of the namespace. It
// returns 1 if it had to, 0 if the namespace already had it.
func linkBlob(ctx context.Context, cs content.Store, cfg config, b bakedImage, desc ocispec.Descriptor, labels map[string]string) (int, error) {
	if info, err := cs.Info(ctx, desc.Digest); err == nil {
		return 0, ensureLabels(ctx, cs, info, labels)
	} else if !errdefs.IsNotFound(err) {
		return 0, fmt.Errorf("content store: %w", err)
	}
	path := filepath.Join(cfg.ContainerdRoot, "io.containerd.content.v1.content", "blobs", desc.Digest.Algorithm().String(), desc.Digest.Encoded())
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return 0, err
	}
	// A blob file that is there (from another namespace, or an earlier
	// boot cut short) is left as it is: containerd checks its size below.
	if err := os.Symlink(b.blob(desc.Digest), path); err != nil && !errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("link blob %s: %w", desc.Digest, err)
	}
	// With the blob present in the backing store, the writer takes
	// containerd's shared-content path: it reads and writes no data, and the
	// commit only records the blob in this namespace.
	ref := "orrery-images-" + desc.Digest.Encoded()
	w, err := cs.Writer(ctx, content.WithRef(ref), content.WithDescriptor(desc))
	if errdefs.IsAlreadyExists(err) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("record blob %s: %w", desc.Digest, err)
	}
	if err := w.Commit(ctx, desc.Size, desc.Digest, content.WithLabels(labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		_ = cs.Abort(ctx, ref)
		return 0, fmt.Errorf("record blob %s: %w (is containerd's content_sharing_policy \"shared\"?)", desc.Digest, err)
	}
	return 1, nil
}

func ensureLabels(ctx context.Context, cs content.Store, info content.Info, labels map[string]string) error {
	var fields []string
	for k, v := range labels {
		if info.Labels[k] != v {
			if info.Labels == nil {
				info.Labels = map[string]string{}
			}
			info.Labels[k] = v
			fields = append(fields, "labels."+k)
		}
	}
	if len(fields) == 0 {
		return nil
	}
	if _, err := cs.Update(ctx, info, fields...); err != nil {
		return fmt.Errorf("label blob %s: %w", info.Digest, err)
	}
	return nil
}

// linkSnapshot commits, under the layer's chain ID, a snapshot whose
// directory is the layer unpacked on the root. It returns false if the
// snapshot was already there.
func linkSnapshot(ctx context.Context, sn snapshots.Snapshotter, b bakedImage) (bool, error) {
	if _, err := sn.Stat(ctx, b.ChainID); err == nil {
		return false, nil
	} else if !errdefs.IsNotFound(err) {
		return false, fmt.Errorf("snapshotter: %w", err)
	}
	key := "orrery-images " + b.ChainID
	// An active snapshot left by a boot cut short in this step.
	if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
		return false, fmt.Errorf("remove the unfinished snapshot %q: %w", key, err)
	}
	mounts, err := sn.Prepare(ctx, key, "")
	if err != nil {
		return false, fmt.Errorf("prepare a snapshot: %w", err)
	}
	// A snapshot without parents is a bind mount of its directory.
	if len(mounts) != 1 || mounts[0].Type != "bind" || filepath.Base(mounts[0].Source) != "fs" {
		_ = sn.Remove(ctx, key)
		return false, fmt.Errorf("the snapshotter's new snapshot is %+v, not a bind mount of a directory named fs: this containerd's overlayfs layout is not the one orrery-images knows", mounts)
	}
	dir := mounts[0].Source
	// Remove fails on a directory that is not empty: nothing written to a
	// snapshot is ever thrown away here.
	if err := os.Remove(dir); err != nil {
		_ = sn.Remove(ctx, key)
		return false, fmt.Errorf("replace the new snapshot's directory: %w", err)
	}
	if err := os.Symlink(b.rootfs(), dir); err != nil {
		_ = sn.Remove(ctx, key)
		return false, fmt.Errorf("link the layer into the snapshot: %w", err)
	}
	if err := sn.Commit(ctx, b.ChainID, key, snapshots.WithLabels(map[string]string{labelRootfs: b.rootfs()})); err != nil {
		_ = sn.Remove(ctx, key)
		return false, fmt.Errorf("commit the snapshot: %w", err)
	}
	return true, nil
}

// recordImage creates or corrects the image record. It returns what it
// did, "" if the record was already right.
func recordImage(ctx context.Context, is images.Store, b bakedImage) (string, error) {
	want := images.Image{
		Name:   b.Name,
		Target: b.Manifest,
		Labels: map[string]string{labelBaked: "true", labelPinned: "pinned", labelCRI: "managed"},
	}
	have, err := is.Get(ctx, b.Name)
	if errdefs.IsNotFound(err) {
		if _, err := is.Create(ctx, want); err != nil {
			return "", fmt.Errorf("create the image record: %w", err)
		}
		return "image recorded", nil
	}
	if err != nil {
		return "", fmt.Errorf("image store: %w", err)
	}
	if have.Target.Digest == want.Target.Digest && have.Labels[labelBaked] == "true" && have.Labels[labelPinned] == "pinned" {
		return "", nil
	}
	fields := []string{"target", "labels." + labelBaked, "labels." + labelPinned, "labels." + labelCRI}
	if _, err := is.Update(ctx, want, fields...); err != nil {
		return "", fmt.Errorf("update the image record: %w", err)
	}
	return "image record updated", nil
}

// deleteStale deletes the images an earlier boot baked that are not in
// keep.
func deleteStale(ctx context.Context, client *containerd.Client, keep map[string]bool, out io.Writer) error {
	is := client.ImageService()
	list, err := is.List(ctx, `labels."`+labelBaked+`"==true`)
	if err != nil {
		return fmt.Errorf("list the baked images: %w", err)
	}
	for _, img := range list {
		if keep[img.Name] {
			continue
		}
		// Synchronous: the garbage collector has dropped the image's
		// snapshot and blobs (their links, never what they point to) when
		// this returns.
		if err := is.Delete(ctx, img.Name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete %s, baked by an earlier image: %w", img.Name, err)
		}
		fmt.Fprintf(out, "%s: deleted (the OS image no longer bakes it)\n", img.Name)
	}
	return nil
}
