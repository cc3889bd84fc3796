package diskimage

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/gpt"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	contents := map[string][]byte{
		"esp":    bytes.Repeat([]byte{1}, 3<<20),
		"root":   bytes.Repeat([]byte{2}, 1<<20+5),
		"verity": []byte("hash tree"),
	}
	var parts []Partition
	for _, name := range []string{"esp", "root", "verity"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, contents[name], 0o600); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, Partition{Name: "p-" + name, Type: TypeRootX86_64, GUID: GUID([]byte(name), "test"), Contents: path})
	}
	spec := Spec{GUID: GUID([]byte("disk"), "test"), Partitions: parts}
	out := filepath.Join(dir, "disk.raw")
	if err := Write(out, spec); err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(out)
	if err := Write(out, spec); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(out)
	if !bytes.Equal(first, second) {
		t.Error("two writes of the same spec differ")
	}
	// 1 MiB head + 3 + 2 + 1 MiB partitions + 1 MiB tail.
	if len(first) != 8<<20 {
		t.Errorf("disk is %d bytes, want %d", len(first), 8<<20)
	}

	g := readGPT(t, out)
	if !strings.EqualFold(g.GUID, spec.GUID) {
		t.Errorf("disk GUID %s, want %s", g.GUID, spec.GUID)
	}
	for i, p := range g.Partitions[:3] {
		name := []string{"esp", "root", "verity"}[i]
		if p.Name != "p-"+name || !strings.EqualFold(p.GUID, parts[i].GUID) || p.Start*512%(1<<20) != 0 {
			t.Errorf("partition %d = %+v, want name p-%s, GUID %s, 1 MiB aligned", i+1, p, name, parts[i].GUID)
		}
		start := int(p.Start * 512)
		if !bytes.Equal(first[start:start+len(contents[name])], contents[name]) {
			t.Errorf("partition %s does not hold its contents", name)
		}
	}
}

// A disk for GCE is a whole number of GiB; its GPT's backup is at the
// new end, and the partitions are where they would be without it.
func TestWriteSizeMultiple(t *testing.T) {
	dir := t.TempDir()
	esp := filepath.Join(dir, "esp")
	if err := os.WriteFile(esp, bytes.Repeat([]byte{1}, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "disk.raw")
	spec := Spec{GUID: GUID([]byte("disk"), "test"), SizeMultiple: 16 << 20,
		Partitions: []Partition{{Name: "esp", Type: TypeESP, GUID: GUID([]byte("esp"), "test"), Contents: esp}}}
	if err := Write(out, spec); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Size() != 16<<20 {
		t.Fatalf("disk %v (%v), want 16 MiB", fi, err)
	}
	if p := readGPT(t, out).Partitions[0]; p.Start*512 != 1<<20 || p.Size != 3<<20 {
		t.Errorf("partition at %d, %d bytes; want at 1 MiB, 3 MiB", p.Start*512, p.Size)
	}
	spec.SizeMultiple = 1000
	if err := Write(out, spec); err == nil {
		t.Error("a size multiple of no whole sectors was taken")
	}
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	testCases := map[string]struct {
		spec    Spec
		wantErr string
	}{
		"no partitions": {spec: Spec{GUID: GUID(nil, "x")}, wantErr: "at least one partition"},
		"no GUID":       {spec: Spec{GUID: GUID(nil, "x"), Partitions: []Partition{{Name: "a", Type: TypeESP, Contents: "x"}}}, wantErr: "GUID"},
		"missing file":  {spec: Spec{GUID: GUID(nil, "x"), Partitions: []Partition{{Name: "a", Type: TypeESP, GUID: GUID(nil, "a"), Contents: filepath.Join(dir, "nope")}}}, wantErr: "no such file"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := Write(filepath.Join(dir, "d.raw"), tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Write() error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestGUID(t *testing.T) {
	a, b := GUID([]byte("seed"), "root"), GUID([]byte("seed"), "verity")
	if a == b || a != GUID([]byte("seed"), "root") {
		t.Errorf("GUID() = %s and %s: want stable and distinct per purpose", a, b)
	}
	if len(a) != 36 || a[14] != '4' {
		t.Errorf("GUID() = %s, want a version 4 GUID", a)
	}
}

// readGPT reads the partition table of the disk image at path.
func readGPT(t *testing.T, path string) *gpt.Table {
	t.Helper()
	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	table, err := d.GetPartitionTable()
	if err != nil {
		t.Fatalf("the GPT of %s: %v", path, err)
	}
	return table.(*gpt.Table)
}
