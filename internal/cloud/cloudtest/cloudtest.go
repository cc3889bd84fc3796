// Package cloudtest builds what tests boot on the local cloud without an OS
// image: Debian's cloud kernel and an initrd whose /init is the test guest
// (internal/cloud/testguest) plus the kernel modules it loads.
package cloudtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/orrery-dev/orrery/internal/nodepackages"
	"github.com/u-root/u-root/pkg/cpio"
)

// GuestModules are the kernel modules the guest loads (with their
// dependencies).
var GuestModules = []string{"virtio_pci", "virtio_net", "virtio_blk"}

var (
	buildOnce sync.Once
	built     struct {
		kernel, initrd string
		err            error
	}
)

// Guest returns a kernel and an initrd with the test guest, built once per
// test binary into a directory that lives as long as the process.
func Guest(tb testing.TB) (kernel, initrd string) {
	tb.Helper()
	buildOnce.Do(func() {
		built.kernel, built.initrd, built.err = buildGuest()
	})
	if built.err != nil {
		tb.Fatalf("build test guest: %v", built.err)
	}
	return built.kernel, built.initrd
}

func buildGuest() (string, string, error) {
	k, err := nodepackages.Kernel()
	if err != nil {
		return "", "", err
	}
	dir, err := os.MkdirTemp("", "orrery-guest-")
	if err != nil {
		return "", "", err
	}
	initBin := filepath.Join(dir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, "github.com/orrery-dev/orrery/internal/cloud/testguest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build testguest: %v\n%s", err, out)
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := writeInitrd(initrd, initBin, k); err != nil {
		return "", "", err
	}
	return k.Path, initrd, nil
}

func writeInitrd(path, initBin string, k nodepackages.KernelPackage) error {
	release := k.Release
	modDir := filepath.Join(k.Root, "lib/modules", release)
	files := map[string]string{"init": initBin}
	deps, err := moduleFiles(modDir, GuestModules)
	if err != nil {
		return err
	}
	for _, rel := range deps {
		files[filepath.Join("lib/modules", release, rel)] = filepath.Join(modDir, rel)
	}
	for _, meta := range []string{"modules.dep", "modules.builtin"} {
		files[filepath.Join("lib/modules", release, meta)] = filepath.Join(modDir, meta)
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)

	var recs []cpio.Record
	for _, dir := range []string{"etc", "proc", "sys", "dev", "tmp"} {
		recs = append(recs, cpio.Directory(dir, 0o755))
	}
	for _, n := range names {
		content, err := os.ReadFile(files[n])
		if err != nil {
			return fmt.Errorf("read %s: %w", files[n], err)
		}
		recs = append(recs, cpio.StaticRecord(content, cpio.Info{Name: n, Mode: cpio.S_IFREG | 0o755}))
	}
	var buf bytes.Buffer
	w := cpio.Newc.Writer(&buf)
	if err := cpio.WriteRecordsAndDirs(w, recs); err != nil {
		return fmt.Errorf("write initrd: %w", err)
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// moduleFiles resolves modules (by name) and their dependencies to paths
// relative to modDir, using modules.dep.
func moduleFiles(modDir string, names []string) ([]string, error) {
	f, err := os.Open(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("kernel modules of the host kernel: %w", err)
	}
	defer f.Close()
	deps := map[string][]string{}
	byName := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
		byName[moduleName(mod)] = mod
	}
	// A module built into the kernel (virtio_pci from 6.12 on) needs no
	// file; the guest's kmodule knows it from modules.builtin.
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for _, mod := range strings.Fields(string(b)) {
			builtin[moduleName(mod)] = true
		}
	}
	seen := map[string]bool{}
	var out []string
	var add func(string)
	add = func(mod string) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		out = append(out, mod)
		for _, d := range deps[mod] {
			add(d)
		}
	}
	for _, n := range names {
		if builtin[n] {
			continue
		}
		mod, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("kernel module %s not found in %s/modules.dep", n, modDir)
		}
		add(mod)
	}
	return out, nil
}

// moduleName is the name of the module at path, as modprobe spells it:
// "kernel/drivers/md/dm-mod.ko.xz" is dm_mod.
func moduleName(path string) string {
	name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".xz"), ".ko")
	return strings.ReplaceAll(name, "-", "_")
}
