package initrdbuild

import (
	"bytes"
	"os"
	"path/filepath"
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
