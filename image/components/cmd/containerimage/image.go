package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Spec describes one image.
type Spec struct {
	Ref        string
	Created    time.Time
	Adds       []Add
	Links      []Link
	Env        []string
	Entrypoint []string
	Cmd        []string
	User       string
	WorkingDir string
}

// Add copies Src from the host to Dst in the image.
type Add struct{ Src, Dst string }

// Link is a symlink at Dst in the image.
type Link struct{ Dst, Target string }

// Result is what containerimage reports about an archive it wrote.
type Result struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"` // manifest digest, as containerd and kubelet show it
	Config string `json:"config"` // config digest (the image ID)
	SHA256 string `json:"sha256"` // of the archive file
	Size   int64  `json:"size"`   // of the archive file
}

// Build writes the image described by spec as an archive at out.
func Build(spec Spec, out string) (Result, error) {
	ref, err := name.NewTag(spec.Ref, name.StrictValidation)
	if err != nil {
		return Result{}, fmt.Errorf("image reference %q: %w", spec.Ref, err)
	}
	layerTar, err := layerBytes(spec)
	if err != nil {
		return Result{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressedCaching, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return Result{}, fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: spec.Created},
			CreatedBy: "orrery containerimage",
		},
	})
	if err != nil {
		return Result{}, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Result{}, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = "amd64"
	cf.OS = "linux"
	cf.Created = v1.Time{Time: spec.Created}
	cf.Config.Env = spec.Env
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.User = spec.User
	cf.Config.WorkingDir = spec.WorkingDir
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return Result{}, fmt.Errorf("config: %w", err)
	}
	return writeArchive(img, ref, out)
}

// entry is one file, directory or symlink of the layer.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// layerBytes returns the uncompressed layer: every added path plus the
// directories above it, sorted, root-owned, with fixed times.
func layerBytes(spec Spec) ([]byte, error) {
	entries := map[string]*entry{}
	mkdirs := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = &entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}}
			}
		}
	}
	put := func(dst string, e *entry) {
		dst = path.Clean(dst)
		mkdirs(dst)
		entries[dst] = e
	}
	for _, a := range spec.Adds {
		if err := addHostPath(a, put); err != nil {
			return nil, err
		}
	}
	for _, l := range spec.Links {
		put(l.Dst, &entry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Linkname: l.Target, Mode: 0o777}})
	}

	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := e.hdr
		h.Name = strings.TrimPrefix(n, "/")
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.Size = int64(len(e.data))
		h.ModTime = spec.Created
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", n, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// addHostPath adds a host file (its symlinks followed) or a directory tree
// (its symlinks kept) at a.Dst.
func addHostPath(a Add, put func(string, *entry)) error {
	st, err := os.Stat(a.Src)
	if err != nil {
		return fmt.Errorf("add %s: %w", a.Src, err)
	}
	if !st.IsDir() {
		return addFile(a.Src, a.Dst, st.Mode(), put)
	}
	return filepath.WalkDir(a.Src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(a.Src, p)
		if err != nil {
			return err
		}
		dst := path.Join(a.Dst, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			put(dst, &entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Mode: int64(info.Mode().Perm())}})
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			put(dst, &entry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}})
		case info.Mode().IsRegular():
			return addFile(p, dst, info.Mode(), put)
		}
		return nil
	})
}

func addFile(src, dst string, mode fs.FileMode, put func(string, *entry)) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("add %s: %w", src, err)
	}
	put(dst, &entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Mode: int64(mode.Perm())}, data: data})
	return nil
}

// writeArchive writes img as an OCI image layout with a Docker manifest.json
// beside it, in one deterministic tar, replacing out in one step.
func writeArchive(img v1.Image, ref name.Tag, out string) (Result, error) {
	parts, err := readImage(img)
	if err != nil {
		return Result{}, err
	}
	f, err := os.CreateTemp(filepath.Dir(out), ".containerimage-*")
	if err != nil {
		return Result{}, fmt.Errorf("create the archive beside %s: %w", out, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	sum := sha256.New()
	a := &archive{tw: tar.NewWriter(io.MultiWriter(f, sum)), epoch: time.Unix(0, 0).UTC()}
	if err := a.writeImage(parts, ref); err != nil {
		return Result{}, fmt.Errorf("write %s: %w", out, err)
	}
	size, err := place(f, out)
	if err != nil {
		return Result{}, err
	}
	return Result{
		Ref:    ref.Name(),
		Digest: parts.digest.String(),
		Config: parts.configName.String(),
		SHA256: hex.EncodeToString(sum.Sum(nil)),
		Size:   size,
	}, nil
}

// imageParts are the pieces of an image that go into its archive.
type imageParts struct {
	manifest, config   []byte
	digest, configName v1.Hash
	layers             []v1.Layer
}

func readImage(img v1.Image) (imageParts, error) {
	var p imageParts
	var err error
	if p.manifest, err = img.RawManifest(); err != nil {
		return p, fmt.Errorf("read the image manifest: %w", err)
	}
	if p.config, err = img.RawConfigFile(); err != nil {
		return p, fmt.Errorf("read the image config: %w", err)
	}
	if p.digest, err = img.Digest(); err != nil {
		return p, fmt.Errorf("digest the image manifest: %w", err)
	}
	if p.configName, err = img.ConfigName(); err != nil {
		return p, fmt.Errorf("digest the image config: %w", err)
	}
	if p.layers, err = img.Layers(); err != nil {
		return p, fmt.Errorf("list the image layers: %w", err)
	}
	return p, nil
}

// archive writes tar entries with fixed times and modes, so that the same
// image always gives the same bytes.
type archive struct {
	tw    *tar.Writer
	epoch time.Time
}

func (a *archive) dir(name string) error {
	if err := a.tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, ModTime: a.epoch, Typeflag: tar.TypeDir, Format: tar.FormatPAX}); err != nil {
		return fmt.Errorf("directory %s: %w", name, err)
	}
	return nil
}

func (a *archive) file(name string, data []byte) error {
	h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: a.epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := a.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if _, err := a.tw.Write(data); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// writeImage writes the OCI layout (oci-layout, blobs, index.json) and the
// Docker manifest.json that names the same blobs.
func (a *archive) writeImage(p imageParts, ref name.Tag) error {
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := a.dir(d); err != nil {
			return err
		}
	}
	if err := a.file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := a.file(blobPath(p.configName), p.config); err != nil {
		return err
	}
	var layerPaths []string
	for _, l := range p.layers {
		path, err := a.layer(l)
		if err != nil {
			return err
		}
		layerPaths = append(layerPaths, path)
	}
	if err := a.file(blobPath(p.digest), p.manifest); err != nil {
		return err
	}
	index, err := ociIndex(ref, p.digest, len(p.manifest))
	if err != nil {
		return err
	}
	if err := a.file("index.json", index); err != nil {
		return err
	}
	docker, err := json.Marshal([]dockerManifest{{Config: blobPath(p.configName), RepoTags: []string{ref.Name()}, Layers: layerPaths}})
	if err != nil {
		return fmt.Errorf("encode manifest.json: %w", err)
	}
	if err := a.file("manifest.json", docker); err != nil {
		return err
	}
	return a.tw.Close()
}

// layer writes one compressed layer blob and returns its path.
func (a *archive) layer(l v1.Layer) (string, error) {
	h, err := l.Digest()
	if err != nil {
		return "", fmt.Errorf("digest a layer: %w", err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return "", fmt.Errorf("layer %s: %w", h, err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return "", fmt.Errorf("read layer %s: %w", h, err)
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != h.Hex {
		return "", fmt.Errorf("layer %s: compressed bytes changed between reads", h)
	}
	return blobPath(h), a.file(blobPath(h), data)
}

// dockerManifest is an entry of a Docker archive's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// ociIndex is the layout's index.json: one manifest, named for containerd
// and tagged for the OCI layout.
func ociIndex(ref name.Tag, digest v1.Hash, manifestSize int) ([]byte, error) {
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIManifestSchema1,
			Digest:    digest,
			Size:      int64(manifestSize),
			Annotations: map[string]string{
				// containerd names the imported image after this.
				"io.containerd.image.name": ref.Name(), // e.g. registry.k8s.io/pause:3.10.2
				// The OCI name of the manifest within the layout: its tag.
				"org.opencontainers.image.ref.name": ref.TagStr(),
			},
		}},
	}
	b, err := json.Marshal(index)
	if err != nil {
		return nil, fmt.Errorf("encode index.json: %w", err)
	}
	return b, nil
}

// place makes the finished temporary file f readable and renames it to
// out; it returns the file's size.
func place(f *os.File, out string) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat the archive: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		return 0, fmt.Errorf("make the archive readable: %w", err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return 0, fmt.Errorf("place %s: %w", out, err)
	}
	return st.Size(), nil
}
