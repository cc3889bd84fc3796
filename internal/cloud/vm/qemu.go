package vm

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// qemuArgs is QEMU's command line (without the binary) for cfg, whose
// defaults are set, with the vTPM's control socket, the QMP socket and the
// serial console's socket.
func qemuArgs(cfg Config, tpmCtrl, qmpSocket, serialSocket string) []string {
	args := []string{
		"-name", opt(cfg.Name),
		"-machine", "q35",
		"-smp", strconv.Itoa(cfg.CPUs),
		"-m", strconv.Itoa(cfg.MemoryMiB),
		// Nothing QEMU would add by itself (monitor, NIC, VGA, ...) and no
		// window: every device is listed below.
		"-nodefaults", "-no-user-config", "-nographic",
		// A socket for a client that types into the console (a debug
		// image's root shell), and a log of everything the guest writes:
		// QEMU logs a write also when the socket refuses it for want of a
		// client (checked with QEMU 7.2), so the log is whole.
		"-chardev", "socket,id=serial0,server=on,wait=off,path=" + opt(serialSocket) +
			",logfile=" + opt(filepath.Join(cfg.Dir, SerialFile)) + logAppend(cfg.AppendSerialLog),
		"-serial", "chardev:serial0",
		"-chardev", "socket,id=qmp,server=on,wait=off,path=" + opt(qmpSocket),
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "socket,id=chrtpm,path=" + opt(tpmCtrl),
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
		"-device", "tpm-crb,tpmdev=tpm0",
		// Guests need entropy early (TLS keys, LUKS passphrases).
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-pci,rng=rng0",
	}
	switch cfg.Accel {
	case AccelKVM:
		args = append(args, "-accel", "kvm", "-cpu", "host")
	default:
		// One host thread per vCPU; "max" gives the guest every CPU
		// feature TCG emulates (x86-64-v3, which distribution kernels and
		// Go binaries may use).
		args = append(args, "-accel", "tcg,thread=multi", "-cpu", "max")
	}
	if cfg.Image != "" {
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+opt(cfg.Firmware.Code),
			"-drive", "if=pflash,format=raw,unit=1,file="+opt(filepath.Join(cfg.Dir, VarsFile)),
			"-drive", "if=none,id=disk0,format=qcow2,file="+opt(filepath.Join(cfg.Dir, OverlayFile)),
			"-device", "virtio-blk-pci,drive=disk0,bootindex=0",
		)
	} else {
		args = append(args, "-kernel", cfg.Kernel)
		if cfg.Initrd != "" {
			args = append(args, "-initrd", cfg.Initrd)
		}
		if cfg.Cmdline != "" {
			args = append(args, "-append", cfg.Cmdline)
		}
	}
	if cfg.StateDiskMiB > 0 {
		args = append(args,
			"-drive", "if=none,id=state,format=qcow2,file="+opt(filepath.Join(cfg.Dir, StateFile)),
			"-device", "virtio-blk-pci,drive=state,serial=state",
		)
	}
	if cfg.Net == nil {
		args = append(args, "-nic", "none")
	} else {
		dev := "virtio-net-pci,netdev=net0"
		if len(cfg.Net.MAC) > 0 {
			dev += ",mac=" + cfg.Net.MAC.String()
		}
		args = append(args,
			"-netdev", fmt.Sprintf("tap,id=net0,ifname=%s,script=no,downscript=no", opt(cfg.Net.Tap)),
			"-device", dev,
		)
	}
	return args
}

// opt escapes a value inside a QEMU option string, where a comma separates
// options and a doubled comma stands for a comma.
func opt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// logAppend is the chardev option that keeps an existing log file.
func logAppend(on bool) string {
	if on {
		return ",logappend=on"
	}
	return ""
}
