package cloud

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/cloud/vm"
)

// Preflight checks that this machine can run spec and returns every
// problem found, each saying what to do, joined into one error.
func Preflight(spec Spec) error { return preflight(spec, false) }

// preflightStart is Preflight for starting a stopped cloud again: its
// disks exist already, and its flags are fixed.
func preflightStart(spec Spec) error { return preflight(spec, true) }

func preflight(spec Spec, stopped bool) error {
	var problems []error
	if !hasNetAdmin() {
		problems = append(problems, errors.New("creating the cloud's bridge and taps needs root or CAP_NET_ADMIN: run with sudo"))
	}
	for _, tool := range []struct{ bin, pkg string }{
		{"qemu-system-x86_64", "qemu-system-x86"},
		{"qemu-img", "qemu-utils"},
		{"swtpm", "swtpm"},
		{"ip", "iproute2"},
		{"haproxy", "haproxy"},
	} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			problems = append(problems, fmt.Errorf("%s is missing: install Debian's %s package (make deps installs it)", tool.bin, tool.pkg))
		}
	}
	if spec.Image != "" {
		if _, err := os.Stat(spec.Image); err != nil && stopped {
			problems = append(problems, fmt.Errorf("OS image %s, which the VMs were made from, is gone: 'orrery mini down' deletes the VMs, 'orrery mini up' makes new ones", spec.Image))
		} else if err != nil {
			problems = append(problems, fmt.Errorf("OS image %s not found: build it with 'make image'", spec.Image))
		}
		fw := vm.DefaultFirmware()
		for _, f := range []string{fw.Code, fw.Vars} {
			if _, err := os.Stat(f); err != nil {
				problems = append(problems, fmt.Errorf("UEFI firmware %s is missing: install Debian's ovmf package", f))
			}
		}
	}
	if spec.Kernel != "" {
		if _, err := os.Stat(spec.Kernel); err != nil {
			problems = append(problems, fmt.Errorf("kernel %s not found", spec.Kernel))
		}
	}
	vms := spec.ControlPlanes + spec.Workers
	mem := spec.MemoryMiB
	if mem == 0 {
		mem = 2048
	}
	if avail, err := memAvailableMiB(); err == nil && avail < vms*mem+512 {
		what := "use fewer VMs or --memory"
		if stopped {
			what = "free memory on this machine first"
		}
		problems = append(problems, fmt.Errorf("%d VMs of %d MiB need %d MiB of memory but only %d MiB are available: %s", vms, mem, vms*mem+512, avail, what))
	}
	if stopped {
		// The disks exist; what they write from here on is not known.
		return errors.Join(problems...)
	}
	needMiB := uint64(vms) * uint64(diskUseMiB(spec.StateDiskMiB))
	dir := spec.Dir
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = parent(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil {
		if free := st.Bavail * uint64(st.Bsize) >> 20; free < needMiB {
			problems = append(problems, fmt.Errorf("%s has %d MiB free, the VMs need about %d MiB: free some space or use another --mini-dir", dir, free, needMiB))
		}
	}
	return errors.Join(problems...)
}

// nodeWritesMiB bounds what one node writes to its sparse qcow2 disks:
// etcd, its journal, pod data and the overlay of the read-only OS disk
// (the container images come with the image). Through the whole e2e
// suite (init, join, reboots, recovery, an upgrade) a node's state disk
// grew to under 200 MiB and its OS overlay to 200 KiB; counting each
// state disk's full size would refuse machines that have room.
const nodeWritesMiB = 2048

func diskUseMiB(stateDiskMiB int) int {
	return min(stateDiskMiB, nodeWritesMiB) + 512
}

func parent(p string) string {
	i := strings.LastIndex(strings.TrimSuffix(p, "/"), "/")
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

// hasNetAdmin reports whether this process has CAP_NET_ADMIN (bit 12 of
// the effective capabilities).
func hasNetAdmin() bool {
	if os.Geteuid() == 0 {
		return true
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_NET_ADMIN) != 0
		}
	}
	return false
}

func memAvailableMiB() (int, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb / 1024, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}
