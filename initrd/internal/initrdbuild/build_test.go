package initrdbuild

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func TestCompressIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "in")
	content := bytes.Repeat([]byte("orrery initrd "), 100000)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	var outs [][]byte
	for _, name := range []string{"a.zst", "b.zst"} {
		raw, _, err := compress(src, filepath.Join(dir, name))
		if err != nil || raw != int64(len(content)) {
			t.Fatalf("compress() = %d, %v", raw, err)
		}
		b, _ := os.ReadFile(filepath.Join(dir, name))
		outs = append(outs, b)
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("two compressions differ")
	}
	dec, _ := zstd.NewReader(nil)
	got, err := dec.DecodeAll(outs[0], nil)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("round trip: %v", err)
	}
}

// The image's initrd takes its tools from the OS tree: each with its
// interpreter and libraries, found in the tree and not on the build host.
func TestTreeFilesComeFromTheTree(t *testing.T) {
	trees, _ := filepath.Glob("../../../build/cache/image/tree-*/usr/sbin/cryptsetup")
	if len(trees) == 0 {
		t.Skip("no OS tree built (make image)")
	}
	root := strings.TrimSuffix(trees[0], "/usr/sbin/cryptsetup")
	files, err := treeFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"usr/sbin/cryptsetup", "usr/sbin/dmsetup", "usr/sbin/mke2fs", "etc/mke2fs.conf", "lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libcryptsetup.so.12"} {
		src, ok := files[want]
		if !ok {
			t.Errorf("the initrd lacks %s: %v", want, files)
			continue
		}
		if !strings.HasPrefix(src, root) {
			t.Errorf("%s comes from %s, not from the tree", want, src)
		}
	}
	if got, err := inTree(root, "/usr/sbin/../../../../etc/passwd"); err != nil || !strings.HasPrefix(got, root+"/") {
		t.Errorf("a path climbing above the tree resolved to %s, %v; want the tree's own", got, err)
	}
}
