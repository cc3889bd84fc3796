package modules

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestFiles(t *testing.T) {
	root := t.TempDir()
	modDir := filepath.Join(root, "lib/modules/6.1.0-test")
	os.MkdirAll(modDir, 0o755)
	dep := "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio.ko\n" +
		"kernel/drivers/virtio/virtio.ko:\n" +
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko\n" +
		"kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/drivers/virtio/virtio.ko\n" +
		"kernel/drivers/net/net_failover.ko:\n" +
		"kernel/drivers/md/dm-mod.ko:\n" +
		"kernel/drivers/md/dm-verity.ko: kernel/drivers/md/dm-mod.ko\n" +
		"kernel/drivers/md/dm-crypt.ko: kernel/drivers/md/dm-mod.ko\n" +
		"kernel/fs/erofs/erofs.ko:\n" +
		"kernel/fs/overlayfs/overlay.ko:\n" +
		"kernel/crypto/xts.ko:\n" +
		"kernel/crypto/af_alg.ko:\n" +
		"kernel/crypto/algif_skcipher.ko: kernel/crypto/af_alg.ko\n" +
		"kernel/arch/x86/crypto/aesni-intel.ko:\n" +
		"kernel/drivers/md/dm-integrity.ko: kernel/crypto/async_tx/async_xor.ko kernel/drivers/md/dm-bufio.ko kernel/drivers/md/dm-mod.ko\n" +
		"kernel/crypto/async_tx/async_xor.ko:\n" +
		"kernel/drivers/md/dm-bufio.ko: kernel/drivers/md/dm-mod.ko\n" +
		"kernel/crypto/authenc.ko:\n" +
		"kernel/unused.ko:\n"
	os.WriteFile(filepath.Join(modDir, "modules.dep"), []byte(dep), 0o644)
	got, err := Files(root, "6.1.0-test")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/arch/x86/crypto/aesni-intel.ko", "kernel/crypto/af_alg.ko", "kernel/crypto/algif_skcipher.ko",
		"kernel/crypto/async_tx/async_xor.ko", "kernel/crypto/authenc.ko",
		"kernel/crypto/xts.ko", "kernel/drivers/block/virtio_blk.ko", "kernel/drivers/md/dm-bufio.ko", "kernel/drivers/md/dm-crypt.ko",
		"kernel/drivers/md/dm-integrity.ko", "kernel/drivers/md/dm-mod.ko", "kernel/drivers/md/dm-verity.ko",
		"kernel/drivers/net/net_failover.ko", "kernel/drivers/net/virtio_net.ko", "kernel/drivers/virtio/virtio.ko",
		"kernel/drivers/virtio/virtio_pci.ko", "kernel/fs/erofs/erofs.ko", "kernel/fs/overlayfs/overlay.ko",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Files() = %q\nwant %q", got, want)
	}

	os.WriteFile(filepath.Join(modDir, "modules.dep"), []byte("kernel/drivers/virtio/virtio_pci.ko:\n"), 0o644)
	if _, err := Files(root, "6.1.0-test"); err == nil {
		t.Fatal("Files() succeeded with modules missing")
	}
}
