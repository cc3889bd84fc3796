package statedisk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/cryptsetup"
)

// newDisk formats a real LUKS2 volume on a file, as the initrd does on a
// blank state disk, with a first-boot passphrase file beside it.
func newDisk(t *testing.T) *Disk {
	t.Helper()
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Fatal("cryptsetup not installed (Debian package cryptsetup-bin): run make deps")
	}
	dir := t.TempDir()
	dev := filepath.Join(dir, "state.img")
	if err := os.WriteFile(dev, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	first := filepath.Join(dir, "run", "first-boot-key")
	os.MkdirAll(filepath.Dir(first), 0o700)
	if err := os.WriteFile(first, bytes.Repeat([]byte{7}, 32), 0o400); err != nil {
		t.Fatal(err)
	}
	tool := &cryptsetup.Tool{}
	if err := tool.FormatLUKS2(context.Background(), dev, first, cryptsetup.FormatOpts{PBKDF: "pbkdf2", Iterations: 1000}); err != nil {
		t.Fatal(err)
	}
	return &Disk{LUKS: tool, Device: dev, FirstBootKey: first, TmpDir: filepath.Join(dir, "run")}
}

func opens(t *testing.T, d *Disk, key []byte) bool {
	t.Helper()
	f := filepath.Join(t.TempDir(), "k")
	os.WriteFile(f, key, 0o400)
	ok, err := d.LUKS.TestKey(context.Background(), d.Device, f)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestRekey(t *testing.T) {
	d := newDisk(t)
	ctx := context.Background()
	uuid, err := d.UUID(ctx)
	if err != nil || len(uuid) != 36 {
		t.Fatalf("UUID = %q, %v", uuid, err)
	}
	derived := bytes.Repeat([]byte{9}, 32)
	if err := d.Rekey(ctx, derived); err != nil {
		t.Fatalf("Rekey: %v", err)
	}
	if !opens(t, d, derived) {
		t.Fatal("the derived key does not open the disk")
	}
	if opens(t, d, bytes.Repeat([]byte{7}, 32)) {
		t.Fatal("the first-boot passphrase still opens the disk")
	}
	if _, err := os.Stat(d.FirstBootKey); !os.IsNotExist(err) {
		t.Fatal("the first-boot passphrase file is still there")
	}
	entries, _ := os.ReadDir(d.TmpDir)
	if len(entries) != 0 {
		t.Fatalf("staged key files left in %s: %v", d.TmpDir, entries)
	}
	// A retry after success is a no-op.
	if err := d.Rekey(ctx, derived); err != nil {
		t.Fatalf("second Rekey: %v", err)
	}
	// Another cluster's key cannot take over the disk.
	err = d.Rekey(ctx, bytes.Repeat([]byte{1}, 32))
	if err == nil || !strings.Contains(err.Error(), "belongs to another cluster") {
		t.Fatalf("rekey with a foreign key: %v", err)
	}
}

func TestRekeyFinishesAnInterruptedRekey(t *testing.T) {
	d := newDisk(t)
	ctx := context.Background()
	derived := bytes.Repeat([]byte{9}, 32)
	// Interrupted after adding the new key: both keys open the disk.
	kf := filepath.Join(t.TempDir(), "k")
	os.WriteFile(kf, derived, 0o400)
	if err := d.LUKS.AddKey(ctx, d.Device, d.FirstBootKey, kf); err != nil {
		t.Fatal(err)
	}
	if err := d.Rekey(ctx, derived); err != nil {
		t.Fatal(err)
	}
	if !opens(t, d, derived) || opens(t, d, bytes.Repeat([]byte{7}, 32)) {
		t.Fatal("interrupted re-key not finished")
	}
}
