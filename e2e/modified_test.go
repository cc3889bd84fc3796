//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/imagebuild/uki"
)

// TestModifiedImage checks the suite's own tool: the modified disk boots
// a UKI that differs from the original in the command line only.
func TestModifiedImage(t *testing.T) {
	img, _ := filepath.Abs(*imageDir)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	qcow, err := modifiedImage(ctx, img, dir, "e2e.modified=1")
	if err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(dir, "check.raw")
	if err := run(ctx, "qemu-img", "convert", "-O", "raw", qcow, raw); err != nil {
		t.Fatal(err)
	}
	off, err := espOffset(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err := exec.CommandContext(ctx, "mtype", "-i", raw+"@@"+itoa(off), "::EFI/BOOT/BOOTX64.EFI").Output()
	if err != nil {
		t.Fatalf("read the UKI back from the ESP: %v", err)
	}
	orig, _ := os.ReadFile(filepath.Join(img, "uki.efi"))
	a, err := uki.Sections(orig)
	if err != nil {
		t.Fatal(err)
	}
	b, err := uki.Sections(onDisk)
	if err != nil {
		t.Fatalf("the modified ESP holds no valid UKI: %v", err)
	}
	if want := append(bytes.Clone(a[uki.Cmdline]), " e2e.modified=1"...); !bytes.Equal(b[uki.Cmdline], want) {
		t.Fatalf("modified command line %q, want %q", b[uki.Cmdline], want)
	}
	for _, s := range []string{uki.Linux, uki.Initrd, uki.OSRel} {
		if !bytes.Equal(a[s], b[s]) {
			t.Errorf("section %s changed", s)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
