package modules

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/nodepackages"
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
		"kernel/drivers/net/ethernet/google/gve/gve.ko.xz:\n" +
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
		"kernel/drivers/virt/coco/sev-guest/sev-guest.ko.xz: kernel/drivers/virt/coco/tsm.ko.xz\n" +
		"kernel/drivers/virt/coco/tdx-guest/tdx-guest.ko.xz: kernel/drivers/virt/coco/tsm.ko.xz\n" +
		"kernel/drivers/virt/coco/tsm.ko.xz:\n" +
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
		"kernel/drivers/net/ethernet/google/gve/gve.ko.xz", "kernel/drivers/net/net_failover.ko", "kernel/drivers/net/virtio_net.ko",
		"kernel/drivers/virt/coco/sev-guest/sev-guest.ko.xz", "kernel/drivers/virt/coco/tdx-guest/tdx-guest.ko.xz",
		"kernel/drivers/virt/coco/tsm.ko.xz",
		"kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_pci.ko", "kernel/fs/erofs/erofs.ko", "kernel/fs/overlayfs/overlay.ko",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Files() = %q\nwant %q", got, want)
	}

	os.WriteFile(filepath.Join(modDir, "modules.dep"), []byte("kernel/drivers/virtio/virtio_pci.ko:\n"), 0o644)
	if _, err := Files(root, "6.1.0-test"); err == nil {
		t.Fatal("Files() succeeded with modules missing")
	}
}

// TestGuestDriver: a driver that finds no hardware (its init's ENODEV)
// says so, and is told from a driver that failed otherwise.
func TestGuestDriver(t *testing.T) {
	for _, c := range []struct {
		err        error
		loaded     bool
		noHardware bool
		says       string
	}{
		{nil, true, false, "sev-guest: loaded, the hardware is there"},
		{unix.ENODEV, false, true, "sev-guest: no such confidential-guest hardware on this VM"},
		{fmt.Errorf("could not find path: %w", os.ErrNotExist), false, false, "sev-guest: not loaded: could not find path"},
		{unix.EKEYREJECTED, false, false, "sev-guest: not loaded: key was rejected by service"},
	} {
		d := guestDriver("sev-guest", c.err)
		if d.Loaded != c.loaded || errors.Is(d.Err, ErrNoHardware) != c.noHardware || !strings.HasPrefix(d.String(), c.says) {
			t.Errorf("guestDriver(%v) = %+v (%q), want loaded %v, no hardware %v, saying %q", c.err, d, d, c.loaded, c.noHardware, c.says)
		}
	}
}

// TestFilesOfTheBuildKernel resolves the initrd's modules in the kernel
// the image pins, the one it boots: it must have every module the initrd
// loads, the guest drivers included.
func TestFilesOfTheBuildKernel(t *testing.T) {
	k, err := nodepackages.Kernel()
	if err != nil {
		t.Skip(err)
	}
	release := k.Release
	files, err := Files(k.Root, release)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sev-guest.ko", "tdx-guest.ko", "tsm.ko", "dm-verity.ko"} {
		if !slices.ContainsFunc(files, func(f string) bool { return strings.Contains(filepath.Base(f), want) }) {
			t.Errorf("the initrd's modules of kernel %s lack %s: %q", release, want, files)
		}
	}
}

// TestUnpacked: the initrd holds modules uncompressed and a modules.dep
// that names them so; a module that is not xz is refused, not copied.
func TestUnpacked(t *testing.T) {
	var packed bytes.Buffer
	w, err := xz.NewWriter(&packed)
	if err != nil {
		t.Fatal(err)
	}
	module := []byte("\x7fELF a module ~Module signature appended~\n")
	w.Write(module)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rel, got, err := Unpacked("kernel/drivers/virt/coco/tsm.ko.xz", packed.Bytes())
	if err != nil || rel != "kernel/drivers/virt/coco/tsm.ko" || !bytes.Equal(got, module) {
		t.Errorf("Unpacked(tsm.ko.xz) = %q, %q, %v", rel, got, err)
	}
	dep := "kernel/a.ko.xz: kernel/b.ko.xz kernel/c.ko\nkernel/b.ko.xz:\n"
	if rel, got, err := Unpacked("modules.dep", []byte(dep)); err != nil || rel != "modules.dep" || string(got) != "kernel/a.ko: kernel/b.ko kernel/c.ko\nkernel/b.ko:\n" {
		t.Errorf("Unpacked(modules.dep) = %q, %q, %v", rel, got, err)
	}
	if rel, got, err := Unpacked("kernel/c.ko", module); err != nil || rel != "kernel/c.ko" || !bytes.Equal(got, module) {
		t.Errorf("Unpacked(c.ko) = %q, %q, %v", rel, got, err)
	}
	if _, _, err := Unpacked("kernel/d.ko.xz", module); err == nil || !strings.Contains(err.Error(), "kernel/d.ko.xz") {
		t.Errorf("Unpacked of a module that is not xz: %v, want an error naming it", err)
	}
	if _, _, err := Unpacked("kernel/e.ko.xz", packed.Bytes()[:packed.Len()/2]); err == nil {
		t.Error("Unpacked of a truncated module succeeded")
	}
}
