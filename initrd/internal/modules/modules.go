// Package modules names the kernel modules the initrd loads and resolves
// them, with their dependencies, to the files the initrd must contain. The
// same list drives the build (Files) and the boot (Load), so the two
// cannot drift apart.
package modules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/u-root/u-root/pkg/kmodule"
	"github.com/ulikunitz/xz"
)

// Names are the modules /init loads, in order. Debian's cloud kernel
// builds them as modules; the TPM drivers, ext4, AES and SHA-256 are built
// in.
var Names = []string{
	"virtio_pci", "virtio_blk", // the disks
	"virtio_net", "gve", // the NIC, for a rejoin: virtio here, gVNIC on GCE's confidential VMs (NVMe, their disks, is built in)
	"dm_mod", "dm_verity", "erofs", // the root filesystem
	"dm_crypt", "xts", "aesni_intel", // the state disk (aes-xts-plain64)
	"dm_integrity", "authenc", // and its per-sector HMAC-SHA256 tags
	"algif_skcipher", // cryptsetup encrypts LUKS keyslots through AF_ALG
	"overlay",        // the writable /etc
}

// GuestDrivers are the confidential-guest drivers, through which a node on
// a real SEV-SNP or TDX VM gets its report or quote from the hardware
// (/dev/sev-guest, /dev/tdx_guest and configfs-tsm). /init tries each
// after Names: on any other VM the driver refuses to load (ENODEV), which
// is not an error; the OS's udev loads the same drivers again from their
// aliases when the hardware is there.
var GuestDrivers = []string{"sev-guest", "tdx-guest"}

// MetaFiles are the module index files kmodule reads at boot.
var MetaFiles = []string{"modules.dep", "modules.builtin"}

// Files returns the paths, relative to modDir (/lib/modules/<release> of
// rootDir), of the module files Names needs, dependencies included, sorted.
func Files(rootDir, release string) ([]string, error) {
	modDir := filepath.Join(rootDir, "lib/modules", release)
	var mu sync.Mutex // kmodule loads dependencies in parallel
	seen := map[string]bool{}
	p, err := kmodule.NewProber(kmodule.ProbeOpts{
		RootDir:        rootDir,
		KVer:           release,
		IgnoreProcMods: true, // the build host's loaded modules are irrelevant
		DryRunCB: func(path string) {
			mu.Lock()
			seen[path] = true
			mu.Unlock()
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kernel modules of %s: %w", release, err)
	}
	for _, n := range append(slices.Clone(Names), GuestDrivers...) {
		if err := p.Probe(n, ""); err != nil {
			return nil, fmt.Errorf("kernel module %s of %s: %w", n, release, err)
		}
	}
	var out []string
	for path := range seen {
		rel, err := filepath.Rel(modDir, path)
		if err != nil {
			return nil, err
		}
		out = append(out, rel)
	}
	sort.Strings(out)
	return out, nil
}

// Load loads Names and their dependencies from /lib/modules/<running
// kernel>, then tries each of GuestDrivers, with one reading of the
// module index. It returns how many of Names it asked for and what became
// of each guest driver; only a failure to load one of Names is an error.
func Load() (int, []GuestDriver, error) {
	p, err := kmodule.NewProber(kmodule.ProbeOpts{})
	if err != nil {
		return 0, nil, err
	}
	for _, n := range Names {
		if err := p.Probe(n, ""); err != nil {
			return 0, nil, fmt.Errorf("load kernel module %s: %w", n, err)
		}
	}
	var drivers []GuestDriver
	for _, n := range GuestDrivers {
		drivers = append(drivers, guestDriver(n, p.Probe(n, "")))
	}
	return len(Names), drivers, nil
}

// GuestDriver is what became of one of GuestDrivers at boot.
type GuestDriver struct {
	Name string
	// Loaded means the driver found its hardware: this VM is that kind of
	// confidential guest.
	Loaded bool
	// Err is why it did not load; ErrNoHardware when it found no such
	// hardware, as on every VM that is not that kind of guest.
	Err error
}

// ErrNoHardware means a guest driver refused to load because the VM is
// not a guest of its kind.
var ErrNoHardware = errors.New("no such confidential-guest hardware")

// guestDriver reads the outcome of loading driver n: the drivers' init
// returns ENODEV where their hardware is missing.
func guestDriver(n string, err error) GuestDriver {
	d := GuestDriver{Name: n, Loaded: err == nil}
	switch {
	case errors.Is(err, unix.ENODEV):
		d.Err = ErrNoHardware
	case err != nil:
		d.Err = err
	}
	return d
}

// String says what the driver's outcome means, for the console.
func (d GuestDriver) String() string {
	switch {
	case d.Loaded:
		return d.Name + ": loaded, the hardware is there"
	case errors.Is(d.Err, ErrNoHardware):
		return d.Name + ": " + ErrNoHardware.Error() + " on this VM"
	}
	return fmt.Sprintf("%s: not loaded: %v", d.Name, d.Err)
}

// xzSuffix ends the names of the modules Debian's kernels from 6.12 on
// compress.
const xzSuffix = ".ko.xz"

// Unpacked returns the file rel of the modules directory, with contents
// data, as the initrd holds it: a module uncompressed, and modules.dep
// naming the uncompressed files. /init would otherwise undo the xz in Go
// at every boot, which took 6.5-8.5 s for the initrd's modules under TCG;
// the initrd as a whole is compressed anyway.
func Unpacked(rel string, data []byte) (string, []byte, error) {
	switch {
	case strings.HasSuffix(rel, xzSuffix):
		r, err := xz.NewReader(bytes.NewReader(data))
		if err != nil {
			return "", nil, fmt.Errorf("kernel module %s: %w", rel, err)
		}
		raw, err := io.ReadAll(r)
		if err != nil {
			return "", nil, fmt.Errorf("kernel module %s: %w", rel, err)
		}
		return strings.TrimSuffix(rel, ".xz"), raw, nil
	case rel == "modules.dep":
		return rel, bytes.ReplaceAll(data, []byte(xzSuffix), []byte(".ko")), nil
	}
	return rel, data, nil
}
