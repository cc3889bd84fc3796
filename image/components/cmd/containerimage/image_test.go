package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBuildIsDeterministicAndImportable(t *testing.T) {
	dir := t.TempDir()
	bin, spec := testImageSpec(t, dir)
	var results []Result
	for i := range 2 {
		out := filepath.Join(dir, "img"+string(rune('a'+i))+".tar")
		// Touch the input between builds: host times must not leak in.
		now := time.Now().Add(time.Duration(i) * time.Hour)
		if err := os.Chtimes(bin, now, now); err != nil {
			t.Fatal(err)
		}
		r, err := Build(spec, out)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	if results[0] != results[1] {
		t.Fatalf("two builds differ:\n%+v\n%+v", results[0], results[1])
	}

	files := readTar(t, filepath.Join(dir, "imga.tar"))
	checkImageIndex(t, files, results[0].Digest)
	checkLayerEntries(t, files, spec.Created)
}

// testImageSpec writes a program and a tree with a symlink under dir and
// returns the program's path and a spec that adds both.
func testImageSpec(t *testing.T, dir string) (string, Spec) {
	t.Helper()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "sub", "lib.so"), []byte("lib"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("lib.so", filepath.Join(tree, "sub", "lib.so.1")); err != nil {
		t.Fatal(err)
	}
	return bin, Spec{
		Ref:        "registry.k8s.io/pause:3.10.2",
		Created:    time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Adds:       []Add{{Src: bin, Dst: "/usr/local/bin/prog"}, {Src: tree, Dst: "/opt/tree"}},
		Links:      []Link{{Dst: "/bin", Target: "usr/bin"}},
		Env:        []string{"PATH=/usr/local/bin"},
		Entrypoint: []string{"/usr/local/bin/prog"},
	}
}

// checkImageIndex checks what containerd and docker import by: an OCI
// index naming the one manifest, and Docker's manifest.json.
func checkImageIndex(t *testing.T, files map[string]tarFile, digest string) {
	t.Helper()
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"].data, &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Digest != digest ||
		index.Manifests[0].Annotations["io.containerd.image.name"] != "registry.k8s.io/pause:3.10.2" {
		t.Fatalf("index.json = %s", files["index.json"].data)
	}
	if _, ok := files["manifest.json"]; !ok {
		t.Fatal("no Docker manifest.json")
	}
}

func checkLayerEntries(t *testing.T, files map[string]tarFile, created time.Time) {
	t.Helper()
	var layer map[string]tarFile
	for name, f := range files {
		if strings.HasPrefix(name, "blobs/") && len(f.data) > 2 && f.data[0] == 0x1f && f.data[1] == 0x8b {
			zr, err := gzip.NewReader(strings.NewReader(string(f.data)))
			if err != nil {
				t.Fatal(err)
			}
			layer = readTarFrom(t, zr)
		}
	}
	want := map[string]string{
		"usr/":                  "dir",
		"usr/local/bin/prog":    "file 0755",
		"opt/tree/sub/lib.so":   "file 0644",
		"opt/tree/sub/lib.so.1": "link lib.so",
		"bin":                   "link usr/bin",
	}
	for name, w := range want {
		f, ok := layer[name]
		if !ok {
			t.Errorf("layer has no %s", name)
			continue
		}
		if f.desc != w {
			t.Errorf("%s: %s, want %s", name, f.desc, w)
		}
		if !f.hdr.ModTime.Equal(created) || f.hdr.Uid != 0 || f.hdr.Gid != 0 {
			t.Errorf("%s: time %v uid %d gid %d", name, f.hdr.ModTime, f.hdr.Uid, f.hdr.Gid)
		}
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	testCases := map[string][]string{
		"no ref":           {"-out", "x.tar"},
		"relative dst":     {"-ref", "a/b:c", "-out", "x.tar", "-add", "src:rel"},
		"bad entrypoint":   {"-ref", "a/b:c", "-out", "x.tar", "-entrypoint", "/pause"},
		"bad created":      {"-ref", "a/b:c", "-out", "x.tar", "-created", "yesterday"},
		"reference no tag": {"-ref", "UPPER/case", "-out", filepath.Join(t.TempDir(), "x.tar")},
	}
	for name, args := range testCases {
		t.Run(name, func(t *testing.T) {
			if err := run(args, io.Discard); err == nil {
				t.Fatal("run succeeded")
			}
		})
	}
}

type tarFile struct {
	hdr  *tar.Header
	data []byte
	desc string
}

func readTar(t *testing.T, p string) map[string]tarFile {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return readTarFrom(t, f)
}

func readTarFrom(t *testing.T, r io.Reader) map[string]tarFile {
	t.Helper()
	out := map[string]tarFile{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		var desc string
		switch h.Typeflag {
		case tar.TypeDir:
			desc = "dir"
		case tar.TypeSymlink:
			desc = "link " + h.Linkname
		case tar.TypeReg:
			desc = "file " + octal(h.Mode)
		}
		out[h.Name] = tarFile{hdr: h, data: data, desc: desc}
	}
}

func octal(m int64) string {
	const digits = "01234567"
	s := ""
	for i := 0; i < 4; i++ {
		s = string(digits[m&7]) + s
		m >>= 3
	}
	return s
}
