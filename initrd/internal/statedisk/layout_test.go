package statedisk

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWritableMounts lists every place the initrd makes writable for the
// OS, and which of them last across a reboot: only the state disk on /var
// and, from it, /etc/kubernetes. A change here changes what root on a
// node can leave for its next boot; docs/security.md and the initrd's
// README say why each is there.
func TestWritableMounts(t *testing.T) {
	type mnt struct {
		source, target, fstype string
		flags                  uintptr
		data                   string
	}
	var got []mnt
	dir := t.TempDir()
	sysroot, run := filepath.Join(dir, "sysroot"), filepath.Join(dir, "run")
	p := &Preparer{
		Sysroot: sysroot, RunDir: run, Rand: bytes.NewReader(bytes.Repeat([]byte{1}, 16)),
		Mount: func(source, target, fstype string, flags uintptr, data string) error {
			got = append(got, mnt{source, target, fstype, flags, data})
			return nil
		},
	}
	if err := p.MountState("/dev/mapper/state"); err != nil {
		t.Fatal(err)
	}
	rel := func(p string) string {
		for _, base := range []string{sysroot, run} {
			if r, err := filepath.Rel(base, p); err == nil && !strings.HasPrefix(r, "..") {
				return map[string]string{sysroot: "", run: "/run"}[base] + "/" + r
			}
		}
		return p
	}
	var lines []string
	for _, m := range got {
		line := rel(m.target) + " " + m.fstype
		if m.source != "" && m.source != m.fstype {
			line += " from " + rel(m.source)
		}
		for _, f := range []struct {
			bit  uintptr
			name string
		}{{unix.MS_BIND, "bind"}, {unix.MS_REMOUNT, "remount"}, {unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"}, {unix.MS_NOEXEC, "noexec"}, {unix.MS_RDONLY, "ro"}} {
			if m.flags&f.bit != 0 {
				line += " " + f.name
			}
		}
		if m.data != "" {
			line += " " + strings.NewReplacer(sysroot, "", run, "/run").Replace(m.data)
		}
		lines = append(lines, line)
	}
	want := []string{
		// The state disk: data, kept.
		"/var ext4 from /dev/mapper/state",
		// /etc: the image's, with a layer that is gone at the next boot.
		"/run/orrery/etc-layer tmpfs nosuid nodev mode=0755,size=16m",
		"/etc overlay lowerdir=/etc,upperdir=/run/orrery/etc-layer/upper,workdir=/run/orrery/etc-layer/work",
		// kubeadm's files, kept, checked at boot (keptfiles), never run.
		"/etc/kubernetes  from /var/lib/orrery/kubernetes bind",
		"/etc/kubernetes  bind remount nosuid nodev noexec",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("the initrd mounts\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for _, d := range []string{"var/lib/orrery/kubernetes", "etc/kubernetes"} {
		if fi, err := os.Stat(filepath.Join(sysroot, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
	for _, d := range []string{"upper", "work"} {
		if _, err := os.Stat(filepath.Join(run, EtcLayerDir, d)); err != nil {
			t.Error(err)
		}
	}
}

// TestMachineID: the ID lasts across boots (journal, kubelet's node info),
// from the state disk into the tmpfs layer of /etc; what is kept there is
// taken only if it is an ID.
func TestMachineID(t *testing.T) {
	boot := func(t *testing.T, sysroot string, random byte) string {
		t.Helper()
		p := &Preparer{Sysroot: sysroot, RunDir: filepath.Join(sysroot, "run"), Rand: bytes.NewReader(bytes.Repeat([]byte{random}, 16)),
			Mount: func(string, string, string, uintptr, string) error { return nil }}
		if err := p.MountState("/dev/mapper/state"); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(sysroot, "etc", "machine-id"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(string(b), "\n")
	}
	sysroot := t.TempDir()
	first := boot(t, sysroot, 0xab)
	if first != "abababababab4bab"+"abababababababab" {
		t.Errorf("first boot's machine ID = %q, want a version 4 UUID's hex from the random bytes", first)
	}
	if again := boot(t, sysroot, 0xcd); again != first {
		t.Errorf("second boot's machine ID = %q, want the kept %q", again, first)
	}
	kept := filepath.Join(sysroot, "var", MachineIDFile)
	for _, bad := range []string{"", "../../etc/passwd", strings.Repeat("0", 32), strings.Repeat("A", 32), strings.Repeat("a", 31), strings.Repeat("a", 32) + "\nExecStart=/bin/sh"} {
		if err := os.WriteFile(kept, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		got := boot(t, sysroot, 0x11)
		if got == bad || !ValidMachineID(got) {
			t.Errorf("kept %q: booted with %q", bad, got)
		}
		if b, _ := os.ReadFile(kept); string(b) != got+"\n" {
			t.Errorf("kept %q: a new ID %q was not kept (%q)", bad, got, b)
		}
	}
}
