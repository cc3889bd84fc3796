package nodepackages

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestKernelInFindsThePinnedKernel(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, Lock), "# comment\nstub systemd-boot-efi 252 x y\nkernel linux-image-6.12.9+deb12-cloud-amd64 6.12.9-1~bpo12+1 abc debian/pool/k.deb\n")
	if _, err := KernelIn(root); !errors.Is(err, ErrNotFetched) {
		t.Fatalf("before the fetch: %v, want ErrNotFetched", err)
	}
	dir := filepath.Join(root, "build/packages/linux-image-6.12.9+deb12-cloud-amd64_6.12.9-1~bpo12+1")
	write(t, filepath.Join(dir, "boot/vmlinuz-6.12.9+deb12-cloud-amd64"), "kernel")
	write(t, dir+".done", "")
	if _, err := KernelIn(root); !errors.Is(err, ErrNotFetched) || !strings.Contains(err.Error(), "no index") {
		t.Fatalf("without depmod's index: %v, want ErrNotFetched", err)
	}
	write(t, filepath.Join(dir, "lib/modules/6.12.9+deb12-cloud-amd64/modules.dep"), "")
	k, err := KernelIn(root)
	if err != nil || k.Release != "6.12.9+deb12-cloud-amd64" || k.Root != dir || k.Path != filepath.Join(dir, "boot/vmlinuz-6.12.9+deb12-cloud-amd64") {
		t.Fatalf("KernelIn = %+v, %v", k, err)
	}
	write(t, filepath.Join(root, Lock), "stub systemd-boot-efi 252 x y\n")
	if _, err := KernelIn(root); err == nil || !strings.Contains(err.Error(), "pin-packages") {
		t.Fatalf("a lock without a kernel: %v, want a refusal that says what to run", err)
	}
}
