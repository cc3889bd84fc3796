// Package modules names the kernel modules the initrd loads and resolves
// them, with their dependencies, to the files the initrd must contain. The
// same list drives the build (Files) and the boot (Load), so the two
// cannot drift apart.
package modules

import (
	"fmt"
	"path/filepath"
	"sort"
	"sync"

	"github.com/u-root/u-root/pkg/kmodule"
)

// Names are the modules /init loads, in order. Debian's cloud kernel
// builds them as modules; the TPM drivers, ext4, AES and SHA-256 are built
// in.
var Names = []string{
	"virtio_pci", "virtio_blk", // the disks
	"virtio_net",                   // the NIC, for a rejoin
	"dm_mod", "dm_verity", "erofs", // the root filesystem
	"dm_crypt", "xts", "aesni_intel", // the state disk (aes-xts-plain64)
	"dm_integrity", "authenc", // and its per-sector HMAC-SHA256 tags
	"algif_skcipher", // cryptsetup encrypts LUKS keyslots through AF_ALG
	"overlay",        // the writable /etc
}

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
	for _, n := range Names {
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
// kernel> and returns how many it asked for.
func Load() (int, error) {
	p, err := kmodule.NewProber(kmodule.ProbeOpts{})
	if err != nil {
		return 0, err
	}
	for _, n := range Names {
		if err := p.Probe(n, ""); err != nil {
			return 0, fmt.Errorf("load kernel module %s: %w", n, err)
		}
	}
	return len(Names), nil
}
