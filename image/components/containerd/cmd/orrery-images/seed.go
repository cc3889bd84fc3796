package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	replaced := 0
	for _, b := range baked {
		t0 := time.Now()
		what, notes, err := seedImage(ctx, client, cfg, b)
		for _, n := range notes {
			fmt.Fprintf(out, "%s: %s\n", b.Name, n)
		}
		replaced += len(notes)
		if err != nil {
			return fmt.Errorf("image %s: %w", b.Name, err)
		}
		keep[b.Name] = true
		fmt.Fprintf(out, "%s: %s (%s)\n", b.Name, what, time.Since(t0).Round(time.Millisecond))
	}
	if err := deleteStale(ctx, client, keep, out); err != nil {
		return err
	}
	took := time.Since(start).Round(time.Millisecond)
	if replaced == 0 {
		fmt.Fprintf(out, "%d baked images available in %s, nothing on the state disk replaced\n", len(baked), took)
	} else {
		fmt.Fprintf(out, "%d baked images available in %s, replaced %d things on the state disk that were not the baked images (see above)\n", len(baked), took, replaced)
	}
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
// returns what it did and, one line each, what it found on the state disk
// that was not the baked image and replaced, for the journal.
func seedImage(ctx context.Context, client *containerd.Client, cfg config, b bakedImage) (string, []string, error) {
	var did, notes []string
	blobs := []struct {
		what   string
		desc   ocispec.Descriptor
		labels map[string]string
	}{
		{"layer", b.Layer, nil},
		{"config", b.Config, map[string]string{"containerd.io/gc.ref.snapshot." + cfg.Snapshotter: b.ChainID}},
		{"manifest", b.Manifest, map[string]string{
			"containerd.io/gc.ref.content.config": b.Config.Digest.String(),
			"containerd.io/gc.ref.content.l.0":    b.Layer.Digest.String(),
		}},
	}
	recorded, relinked := 0, 0
	for _, bl := range blobs {
		rec, was, err := linkBlob(ctx, client.ContentStore(), cfg, b, bl.desc, bl.labels)
		if was != "" {
			notes = append(notes, fmt.Sprintf("%s blob %s was not the baked blob (%s); relinked", bl.what, bl.desc.Digest, was))
			relinked++
		}
		if err != nil {
			return "", notes, err
		}
		if rec {
			recorded++
		}
	}
	if recorded > 0 {
		did = append(did, blobCount(recorded)+" linked")
	}
	if relinked > 0 {
		did = append(did, blobCount(relinked)+" relinked")
	}
	made, was, err := linkSnapshot(ctx, client.SnapshotService(cfg.Snapshotter), b)
	if was != "" {
		how := "relinked"
		if made {
			how = "re-made"
		}
		notes = append(notes, fmt.Sprintf("layer snapshot was not the baked layer (%s); %s", was, how))
		did = append(did, "layer "+how)
	} else if made {
		did = append(did, "layer linked")
	}
	if err != nil {
		return "", notes, err
	}
	what, err := recordImage(ctx, client.ImageService(), b)
	if err != nil {
		return "", notes, err
	}
	if what != "" {
		did = append(did, what)
	}
	if len(did) == 0 {
		return "already available", notes, nil
	}
	return strings.Join(did, ", "), notes, nil
}

func blobCount(n int) string {
	if n == 1 {
		return "1 blob"
	}
	return fmt.Sprintf("%d blobs", n)
}

// linkBlob makes desc's blob, on the root, a blob of the namespace: the
// content store's file for it is a symlink to the blob on the root, and
// the namespace records it. It returns whether it had to record it and,
// if the file was something else, what that was (it replaced it).
//
// The file is checked on every boot, not only when containerd lacks the
// blob: the state disk is writable by whoever is root on the node, and
// containerd checks only the size of a blob it has, so a config or
// manifest of the same size with other bytes (another entrypoint, another
// environment) would otherwise outlive a reboot.
func linkBlob(ctx context.Context, cs content.Store, cfg config, b bakedImage, desc ocispec.Descriptor, labels map[string]string) (bool, string, error) {
	info, err := cs.Info(ctx, desc.Digest)
	known := err == nil
	if err != nil && !errdefs.IsNotFound(err) {
		return false, "", fmt.Errorf("content store: %w", err)
	}
	path := filepath.Join(cfg.ContainerdRoot, "io.containerd.content.v1.content", "blobs", desc.Digest.Algorithm().String(), desc.Digest.Encoded())
	was, err := relink(path, b.blob(desc.Digest))
	if err != nil {
		return false, "", fmt.Errorf("link blob %s: %w", desc.Digest, err)
	}
	// A blob not yet recorded and not yet linked is the first boot's
	// ordinary case, not a replacement.
	if was == missing && !known {
		was = ""
	}
	if known {
		return false, was, ensureLabels(ctx, cs, info, labels)
	}
	// With the blob present in the backing store, the writer takes
	// containerd's shared-content path: it reads and writes no data, and the
	// commit only records the blob in this namespace.
	ref := "orrery-images-" + desc.Digest.Encoded()
	w, err := cs.Writer(ctx, content.WithRef(ref), content.WithDescriptor(desc))
	if errdefs.IsAlreadyExists(err) {
		return true, was, nil
	}
	if err != nil {
		return false, was, fmt.Errorf("record blob %s: %w", desc.Digest, err)
	}
	if err := w.Commit(ctx, desc.Size, desc.Digest, content.WithLabels(labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		_ = cs.Abort(ctx, ref)
		return false, was, fmt.Errorf("record blob %s: %w (is containerd's content_sharing_policy \"shared\"?)", desc.Digest, err)
	}
	return true, was, nil
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

// missing is what relink reports for a path where there was nothing.
const missing = "missing"

// relink makes path a symlink to target. It returns "" if path already
// was exactly that, and otherwise what was there, which it removed: a
// directory with all it held, a file, or a symlink elsewhere. On a boot
// where nothing changed this is one readlink.
func relink(path, target string) (string, error) {
	if to, err := os.Readlink(path); err == nil && to == target {
		return "", nil
	}
	was, err := describe(path)
	if err != nil {
		return "", err
	}
	if err := os.RemoveAll(path); err != nil {
		return "", fmt.Errorf("remove what was there (%s): %w", was, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := os.Symlink(target, path); err != nil {
		return "", err
	}
	return was, nil
}

// describe says what is at path, for a journal line. A symlink's target
// is quoted: whoever wrote it chose its bytes.
func describe(path string) (string, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return missing, nil
	case err != nil:
		return "", err
	case fi.Mode()&fs.ModeSymlink != 0:
		to, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("a symlink to %q", to), nil
	case fi.IsDir():
		return "a directory", nil
	case fi.Mode().IsRegular():
		return fmt.Sprintf("a regular file of %d bytes", fi.Size()), nil
	default:
		return fmt.Sprintf("a file of mode %s", fi.Mode()), nil
	}
}

// linkSnapshot makes the snapshot named by the layer's chain ID the layer
// unpacked on the root: a committed snapshot without parents whose
// directory is a symlink to the rootfs. It returns whether it (re)made the
// snapshot and, if what it found was something else, what that was.
//
// As with the blobs, an existing snapshot is checked on every boot: a
// directory (or a symlink elsewhere) in place of the link would hand the
// baked, privileged DaemonSets whatever binaries an attacker left on the
// state disk. A wrong directory is repaired in place rather than by
// removing the snapshot: the snapshots of containers from an earlier boot
// name it as their parent, so containerd would refuse to remove it, and
// their overlays reach the layer through this same path.
func linkSnapshot(ctx context.Context, sn snapshots.Snapshotter, b bakedImage) (bool, string, error) {
	info, err := sn.Stat(ctx, b.ChainID)
	if errdefs.IsNotFound(err) {
		return true, "", makeSnapshot(ctx, sn, b)
	}
	if err != nil {
		return false, "", fmt.Errorf("snapshotter: %w", err)
	}
	dir, notBaked, err := snapshotDir(ctx, sn, info)
	if err != nil {
		return false, "", err
	}
	if notBaked != "" {
		// The snapshotter's own records are wrong, which no link repairs:
		// the snapshot has to go. containerd refuses while containers'
		// snapshots are based on it, and those would see the layers an
		// attacker stacked under it.
		if err := sn.Remove(ctx, b.ChainID); errdefs.IsFailedPrecondition(err) {
			return false, "", fmt.Errorf("layer snapshot %s is not the baked layer (%s), and snapshots of containers are based on it: the state disk was tampered with; remove those containers (crictl rm) and restart orrery-images.service, or replace the node: %w", b.ChainID, notBaked, err)
		} else if err != nil && !errdefs.IsNotFound(err) {
			return false, "", fmt.Errorf("remove the layer snapshot, not the baked layer (%s): %w", notBaked, err)
		}
		if err := makeSnapshot(ctx, sn, b); err != nil {
			return false, "", fmt.Errorf("make the layer snapshot again, in place of one not the baked layer (%s): %w", notBaked, err)
		}
		return true, notBaked, nil
	}
	was, err := relink(dir, b.rootfs())
	if err != nil {
		return false, "", fmt.Errorf("link the layer into its snapshot: %w", err)
	}
	return false, was, nil
}

// snapshotDir returns the directory of the committed snapshot info names,
// or why that snapshot is not one the baked layer could be.
//
// The directory is the overlayfs snapshotter's snapshots/<id>/fs, and the
// id is in the snapshotter's bolt database, which containerd holds locked
// while it runs. So it is read from the snapshotter itself: a view of a
// snapshot without parents is a bind mount of that snapshot's directory,
// the same path the snapshotter puts in the lowerdir of every container
// based on it. That makes it the path to check whatever the database
// holds: a label recording it would be one more thing on the state disk to
// trust. The view costs a few small database transactions; its empty
// directory goes with containerd's next garbage collection.
func snapshotDir(ctx context.Context, sn snapshots.Snapshotter, info snapshots.Info) (dir, notBaked string, err error) {
	if info.Kind != snapshots.KindCommitted {
		return "", fmt.Sprintf("a snapshot of kind %s, not a committed one", info.Kind), nil
	}
	if info.Parent != "" {
		return "", fmt.Sprintf("it has a parent, %q", info.Parent), nil
	}
	key := "orrery-images view " + info.Name
	mounts, err := sn.View(ctx, key, info.Name)
	if errdefs.IsAlreadyExists(err) {
		// Left by a boot cut short here.
		if err := sn.Remove(ctx, key); err != nil {
			return "", "", fmt.Errorf("remove the view %q: %w", key, err)
		}
		mounts, err = sn.View(ctx, key, info.Name)
	}
	if err != nil {
		return "", "", fmt.Errorf("view the layer snapshot: %w", err)
	}
	if err := sn.Remove(ctx, key); err != nil {
		return "", "", fmt.Errorf("remove the view %q: %w", key, err)
	}
	if len(mounts) != 1 || mounts[0].Type != "bind" || filepath.Base(mounts[0].Source) != "fs" {
		// The snapshotter's records, below containerd's, give it parents.
		return "", fmt.Sprintf("its view is %d mounts, not a bind mount of its directory: it has parent layers", len(mounts)), nil
	}
	return mounts[0].Source, "", nil
}

// makeSnapshot commits, under the layer's chain ID, a snapshot whose
// directory is the layer unpacked on the root.
func makeSnapshot(ctx context.Context, sn snapshots.Snapshotter, b bakedImage) error {
	key := "orrery-images " + b.ChainID
	// An active snapshot left by a boot cut short in this step.
	if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove the unfinished snapshot %q: %w", key, err)
	}
	mounts, err := sn.Prepare(ctx, key, "")
	if err != nil {
		return fmt.Errorf("prepare a snapshot: %w", err)
	}
	// A snapshot without parents is a bind mount of its directory.
	if len(mounts) != 1 || mounts[0].Type != "bind" || filepath.Base(mounts[0].Source) != "fs" {
		_ = sn.Remove(ctx, key)
		return fmt.Errorf("the snapshotter's new snapshot is %+v, not a bind mount of a directory named fs: this containerd's overlayfs layout is not the one orrery-images knows", mounts)
	}
	dir := mounts[0].Source
	// Remove fails on a directory that is not empty: nothing written to a
	// snapshot is ever thrown away here.
	if err := os.Remove(dir); err != nil {
		_ = sn.Remove(ctx, key)
		return fmt.Errorf("replace the new snapshot's directory: %w", err)
	}
	if err := os.Symlink(b.rootfs(), dir); err != nil {
		_ = sn.Remove(ctx, key)
		return fmt.Errorf("link the layer into the snapshot: %w", err)
	}
	if err := sn.Commit(ctx, b.ChainID, key, snapshots.WithLabels(map[string]string{labelRootfs: b.rootfs()})); err != nil {
		_ = sn.Remove(ctx, key)
		return fmt.Errorf("commit the snapshot: %w", err)
	}
	return nil
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
	if sameTarget(have.Target, want.Target) && sameLabels(have.Labels, want.Labels) {
		return "", nil
	}
	fields := []string{"target", "labels." + labelBaked, "labels." + labelPinned, "labels." + labelCRI}
	if _, err := is.Update(ctx, want, fields...); err != nil {
		return "", fmt.Errorf("update the image record: %w", err)
	}
	return "image record updated", nil
}

// sameTarget reports whether a record's target is the baked manifest (want
// has no platform, URLs or annotations): the record is on the state disk
// too, and the media type and platform say how the manifest is read.
func sameTarget(have, want ocispec.Descriptor) bool {
	return have.Digest == want.Digest && have.MediaType == want.MediaType && have.Size == want.Size &&
		have.Platform == nil && len(have.URLs) == 0 && len(have.Annotations) == 0
}

// sameLabels reports whether have holds every label of want.
func sameLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
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
