package statedisk

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/atomicfile"
)

// What the node's OS may write, and what of it lasts.
//
// The root is read-only (dm-verity) and holds every program and every
// piece of configuration the OS runs. The state disk holds data: etcd's,
// kubelet's and containerd's, the node's keys and certificates, logs. It
// is mounted on /var. /etc is the image's /etc with a writable layer on a
// tmpfs: what the OS writes there (systemd's runtime files, the CNI
// configuration flannel writes at every start) is gone at the next boot,
// so nothing planted in /etc comes back. The one exception is
// /etc/kubernetes, which kubeadm writes once and kubelet and the control
// plane read on every boot: it lives on the state disk (KubernetesDir)
// and is bind-mounted, without exec, suid or device files; the initrd
// checks it before the OS starts (package keptfiles). /etc/machine-id is
// kept too (MachineIDFile), as 32 hex digits the initrd checks and
// writes into the tmpfs layer.
const (
	// KubernetesDir is /etc/kubernetes on the state disk, relative to the
	// state filesystem (mounted on /var).
	KubernetesDir = "lib/orrery/kubernetes"
	// MachineIDFile is the node's machine ID on the state disk, relative
	// to the state filesystem.
	MachineIDFile = "lib/orrery/machine-id"
	// EtcLayerDir is the tmpfs that holds the writable layer of /etc,
	// relative to the run directory (/run, which moves into the OS).
	EtcLayerDir = "orrery/etc-layer"
	// etcLayerSize bounds the tmpfs: the OS writes a few KiB there.
	etcLayerSize = "16m"
)

// Mount is one mount the initrd makes for the OS.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
}

// Layout lists the mounts of the state disk dev for an OS at sysroot, in
// the order they are made: every writable place the OS has, apart from
// the kernel's and systemd's own file systems (/run, /dev, /proc, /sys,
// /tmp), is here.
func Layout(dev, sysroot, run string) []Mount {
	varDir := filepath.Join(sysroot, "var")
	etc := filepath.Join(sysroot, "etc")
	layer := filepath.Join(run, EtcLayerDir)
	const safe = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	return []Mount{
		{Source: dev, Target: varDir, FSType: "ext4"},
		{Source: "tmpfs", Target: layer, FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755,size=" + etcLayerSize},
		{Source: "overlay", Target: etc, FSType: "overlay",
			Data: fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", etc, filepath.Join(layer, "upper"), filepath.Join(layer, "work"))},
		// A bind mount takes no flags: the remount after it sets them.
		{Source: filepath.Join(varDir, KubernetesDir), Target: filepath.Join(etc, "kubernetes"), Flags: unix.MS_BIND},
		{Target: filepath.Join(etc, "kubernetes"), Flags: unix.MS_REMOUNT | unix.MS_BIND | safe},
	}
}

// MountState mounts the opened state volume dev for the OS (Layout), and
// puts the node's machine ID in /etc. It is the same on every boot.
func (p *Preparer) MountState(dev string) error {
	sysroot := p.Sysroot
	if sysroot == "" {
		sysroot = DefaultSysroot
	}
	run := p.RunDir
	if run == "" {
		run = "/run"
	}
	varDir := filepath.Join(sysroot, "var")
	for _, m := range Layout(dev, sysroot, run) {
		if m.Flags&unix.MS_REMOUNT == 0 {
			if err := os.MkdirAll(m.Target, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", m.Target, err)
			}
		}
		if m.FSType == "overlay" {
			// On the tmpfs, which is mounted by now.
			layer := filepath.Join(run, EtcLayerDir)
			for _, d := range []string{"upper", "work"} {
				if err := os.MkdirAll(filepath.Join(layer, d), 0o755); err != nil {
					return fmt.Errorf("create the /etc layer: %w", err)
				}
			}
		}
		if m.Source == filepath.Join(varDir, KubernetesDir) {
			if err := os.MkdirAll(m.Source, 0o700); err != nil {
				return fmt.Errorf("create %s on the state disk: %w", KubernetesDir, err)
			}
		}
		if err := p.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil {
			if m.Target == varDir {
				return fmt.Errorf("mount state disk on %s (the root filesystem must have an empty /var): %w", varDir, err)
			}
			return fmt.Errorf("mount %s on %s: %w", describe(m), m.Target, err)
		}
	}
	id, err := machineID(filepath.Join(varDir, MachineIDFile), p.Rand)
	if err != nil {
		return err
	}
	// Into the tmpfs layer: the image's /etc/machine-id is empty, and
	// systemd would make a new ID at every boot.
	if err := os.WriteFile(filepath.Join(sysroot, "etc", "machine-id"), []byte(id+"\n"), 0o444); err != nil {
		return fmt.Errorf("write /etc/machine-id: %w", err)
	}
	return nil
}

func describe(m Mount) string {
	switch {
	case m.Flags&unix.MS_REMOUNT != 0:
		return "the flags nosuid,nodev,noexec"
	case m.Flags&unix.MS_BIND != 0:
		return m.Source
	}
	return m.FSType
}

// machineID returns the ID kept at path, or makes one and keeps it there
// when there is none or what is there is not an ID.
func machineID(path string, r io.Reader) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if id := string(bytes.TrimSuffix(b, []byte("\n"))); ValidMachineID(id) {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read the machine ID: %w", err)
	}
	if r == nil {
		r = rand.Reader
	}
	var raw [16]byte
	if _, err := io.ReadFull(r, raw[:]); err != nil {
		return "", fmt.Errorf("make a machine ID: %w", err)
	}
	// A version 4 UUID's bits, as systemd makes its IDs.
	raw[6] = raw[6]&0x0f | 0x40
	raw[8] = raw[8]&0x3f | 0x80
	id := hex.EncodeToString(raw[:])
	if err := atomicfile.WriteFile(path, []byte(id+"\n"), 0o444); err != nil {
		return "", fmt.Errorf("keep the machine ID: %w", err)
	}
	return id, nil
}

// ValidMachineID reports whether id is a machine ID as systemd writes it:
// 32 lowercase hex digits, not all zero.
func ValidMachineID(id string) bool {
	if len(id) != 32 || id == "00000000000000000000000000000000" {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
