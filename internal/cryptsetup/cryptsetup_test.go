package cryptsetup

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestFormatOnFile formats a LUKS2 volume on a plain file, which works
// without device-mapper (opening it would not).
func TestFormatOnFile(t *testing.T) {
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Skip("cryptsetup not installed (Debian package cryptsetup-bin; make deps)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk")
	if err := os.WriteFile(disk, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o400); err != nil {
		t.Fatal(err)
	}
	var tool Tool
	if ok, err := tool.IsLUKS(ctx, disk); err != nil || ok {
		t.Fatalf("IsLUKS(blank) = %v, %v; want false, nil", ok, err)
	}
	if err := tool.FormatLUKS2(ctx, disk, key, FormatOpts{PBKDF: "pbkdf2", Iterations: 1000, Label: "test"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := tool.IsLUKS(ctx, disk); err != nil || !ok {
		t.Fatalf("IsLUKS(formatted) = %v, %v; want true, nil", ok, err)
	}
	if _, err := tool.IsLUKS(ctx, filepath.Join(dir, "missing")); err == nil {
		t.Error("IsLUKS(missing file) succeeded")
	}
}
