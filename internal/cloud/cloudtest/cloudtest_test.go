package cloudtest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestModuleFiles: modules built into the kernel need no file, and
// xz-compressed ones (Debian's from 6.12 on) resolve by their names.
func TestModuleFiles(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko.xz\n" +
		"kernel/drivers/net/net_failover.ko.xz:\nkernel/drivers/block/virtio_blk.ko.xz:\n"
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/drivers/virtio/virtio_pci.ko\n"), 0o644)
	got, err := moduleFiles(dir, GuestModules)
	want := []string{"kernel/drivers/net/virtio_net.ko.xz", "kernel/drivers/net/net_failover.ko.xz", "kernel/drivers/block/virtio_blk.ko.xz"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("moduleFiles = %q, %v; want %q", got, err, want)
	}
	if _, err := moduleFiles(dir, []string{"dm_verity"}); err == nil {
		t.Error("moduleFiles found a module the kernel lacks")
	}
}
