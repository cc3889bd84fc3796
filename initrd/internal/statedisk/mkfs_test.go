package statedisk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseBackups(t *testing.T) {
	tests := map[string]struct {
		out     string
		want    []int64
		wantErr bool
	}{
		"several lines": {
			out: "Creating filesystem with 2621440 4k blocks and 655360 inodes\n" +
				"Superblock backups stored on blocks: \n\t32768, 98304, 163840, 229376, 294912, 819200, 884736, 1605632\n\n" +
				"Allocating group tables: done\n",
			want: []int64{32768, 98304, 163840, 229376, 294912, 819200, 884736, 1605632},
		},
		"none":          {out: "Creating filesystem with 4096 4k blocks and 4096 inodes\n\n"},
		"not a number":  {out: "Superblock backups stored on blocks: \n\t32768, x\n", wantErr: true},
		"negative":      {out: "Superblock backups stored on blocks: \n\t-5\n", wantErr: true},
		"out of range":  {out: "Superblock backups stored on blocks: \n\t99999999999999999999\n", wantErr: true},
		"after the end": {out: "Superblock backups stored on blocks: \n\t32768\n\nWriting: 3, 4\n", want: []int64{32768}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseBackups([]byte(tc.out))
			if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parseBackups = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestMakeExt4WritesWhatItReads runs the real mke2fs on a file full of a
// marker byte and checks that the regions mke2fs reads before writing
// were zeroed first, and that e2fsck finds a clean filesystem.
func TestMakeExt4WritesWhatItReads(t *testing.T) {
	if _, err := exec.LookPath("mke2fs"); err != nil {
		t.Skip("mke2fs not installed (make deps)")
	}
	dev := filepath.Join(t.TempDir(), "vol")
	const size = 1 << 30
	f, err := os.Create(dev)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse except for the marker around where mke2fs's backups land.
	marker := bytes.Repeat([]byte{0xa5}, zeroSpan)
	for _, off := range []int64{0, 32768 * blockSize, 98304 * blockSize, size - zeroSpan} {
		if _, err := f.WriteAt(marker, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	if err := (E2fs{}).MakeExt4(context.Background(), dev, "orrery-state"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(dev)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{32768 * blockSize, 98304 * blockSize, size - zeroSpan} {
		if bytes.Contains(raw[off:off+zeroSpan], []byte{0xa5, 0xa5, 0xa5, 0xa5}) {
			t.Errorf("the marker survived at byte %d: mke2fs would have read a block never written", off)
		}
	}
	if out, err := exec.Command("e2fsck", "-fn", dev).CombinedOutput(); err != nil {
		t.Errorf("e2fsck: %v\n%s", err, out)
	}
}

// TestMakeExt4WritesLess checks the inode ratio and journal size that keep
// a first boot's mke2fs short, on a sparse file of the local cloud's 10
// GiB, and that a small volume keeps mke2fs's own journal size.
func TestMakeExt4WritesLess(t *testing.T) {
	if _, err := exec.LookPath("dumpe2fs"); err != nil {
		t.Skip("e2fsprogs not installed (make deps)")
	}
	for _, tc := range []struct {
		size                int64
		inodes, journalSize string
	}{
		{10 << 30, "163840", "32M"},
		{256 << 20, "4096", "16M"},
	} {
		dev := filepath.Join(t.TempDir(), "vol")
		if err := os.WriteFile(dev, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(dev, tc.size); err != nil {
			t.Fatal(err)
		}
		if err := (E2fs{}).MakeExt4(context.Background(), dev, "orrery-state"); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("dumpe2fs", "-h", dev).CombinedOutput()
		if err != nil {
			t.Fatalf("dumpe2fs: %v\n%s", err, out)
		}
		for _, want := range []string{"Inode count:              " + tc.inodes, "Total journal size:       " + tc.journalSize} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%d MiB: dumpe2fs -h lacks %q:\n%s", tc.size>>20, want, out)
			}
		}
	}
}
