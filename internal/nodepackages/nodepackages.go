// Package nodepackages finds the Debian packages the node image is made of
// outside its OS tree: the cloud kernel and systemd-stub that
// image/packages/packages.lock pins, fetched, checked and unpacked into
// build/packages by 'make packages' (image/packages/fetch.sh). The
// image's UKI and the initrd's modules come from them, and the local
// cloud's tests boot that kernel directly; nothing is taken from the build
// host's /boot, /lib/modules or /usr/lib/systemd/boot.
package nodepackages

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Lock is the lock file, relative to the checkout.
const Lock = "image/packages/packages.lock"

// KernelPackage is the unpacked kernel package.
type KernelPackage struct {
	// Path is the kernel image (ROOT/boot/vmlinuz-RELEASE).
	Path string
	// Release is its release (uname -r).
	Release string
	// Root is where the package is unpacked: its modules are in
	// ROOT/lib/modules/RELEASE, with the index depmod made.
	Root string
}

// ErrNotFetched means a pinned package is not unpacked yet.
var ErrNotFetched = errors.New("the node's pinned packages are not fetched: run 'make packages'")

// Kernel finds the kernel the checkout around the working directory pins.
func Kernel() (KernelPackage, error) {
	root, err := checkout()
	if err != nil {
		return KernelPackage{}, err
	}
	return KernelIn(root)
}

// KernelIn finds the kernel the checkout at root pins.
func KernelIn(root string) (KernelPackage, error) {
	dir, err := unpacked(root, "kernel")
	if err != nil {
		return KernelPackage{}, err
	}
	images, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return KernelPackage{}, fmt.Errorf("%s holds %d kernel images, want one: remove it and run 'make packages'", dir, len(images))
	}
	k := KernelPackage{Path: images[0], Release: strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-"), Root: dir}
	if _, err := os.Stat(filepath.Join(dir, "lib", "modules", k.Release, "modules.dep")); err != nil {
		return KernelPackage{}, fmt.Errorf("%w: the modules of %s have no index (%v)", ErrNotFetched, k.Release, err)
	}
	return k, nil
}

// StubPath is systemd-stub in the systemd-boot-efi package.
const StubPath = "usr/lib/systemd/boot/efi/linuxx64.efi.stub"

// Stub finds the systemd-stub the checkout around the working directory
// pins.
func Stub() (string, error) {
	root, err := checkout()
	if err != nil {
		return "", err
	}
	dir, err := unpacked(root, "stub")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, StubPath)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("the pinned systemd-boot-efi: %w", err)
	}
	return path, nil
}

// unpacked is the folder the lock's package of role is unpacked in.
func unpacked(root, role string) (string, error) {
	name, version, err := pinned(filepath.Join(root, Lock), role)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "build", "packages", name+"_"+version)
	if _, err := os.Stat(dir + ".done"); err != nil {
		return "", fmt.Errorf("%w (%s %s into %s)", ErrNotFetched, name, version, dir)
	}
	return dir, nil
}

// pinned reads the lock's line of role: "ROLE NAME VERSION SHA256 PATH".
func pinned(lock, role string) (name, version string, err error) {
	f, err := os.Open(lock)
	if err != nil {
		return "", "", fmt.Errorf("the package lock: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 5 && fields[0] == role {
			return fields[1], fields[2], nil
		}
	}
	if err := s.Err(); err != nil {
		return "", "", fmt.Errorf("%s: %w", lock, err)
	}
	return "", "", fmt.Errorf("%s pins no %s: run 'make pin-packages'", lock, role)
}

func checkout() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, Lock)); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no checkout of Orrery above %s to find %s in", wd, Lock)
		}
	}
}
