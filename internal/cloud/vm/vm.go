// Package vm runs one VM of the local cloud: a QEMU process with a vTPM
// (swtpm), a copy-on-write disk over the node image, a blank state disk,
// its own UEFI variable store, and a serial console (a socket to type into
// and a log), all in the VM's own directory, controlled through QMP.
//
// The harness provisions the vTPM before the VM's first boot (the
// attestation key and its certificate), as a cloud provider does; QEMU
// runs under KVM where it works and under TCG (software emulation)
// elsewhere, as Probe decides. QEMU and swtpm die with the Go process that
// started them, and every process of a VM names the VM's directory on its
// command line, so a crashed harness's leftovers can be found.
package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/orrery-dev/orrery/internal/childproc"
	"github.com/orrery-dev/orrery/internal/cloud/qmp"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm"
)

// Accel is how QEMU runs the guest's CPUs.
type Accel string

const (
	// AccelKVM runs the guest on the host's CPU (hardware virtualisation).
	AccelKVM Accel = "kvm"
	// AccelTCG emulates the CPU: slow (~10x), but works everywhere.
	AccelTCG Accel = "tcg"
)

// QEMUBinary is the QEMU executable looked up in PATH.
const QEMUBinary = "qemu-system-x86_64"

// Names of the files in a VM's directory. Logs end in .log, so that a
// cleanup that keeps logs can tell them apart.
const (
	OverlayFile  = "disk.qcow2"  // copy-on-write overlay of Config.Image
	StateFile    = "state.qcow2" // the blank state disk
	VarsFile     = "efivars.fd"  // the VM's copy of the UEFI variable store
	TPMDir       = "tpm"         // swtpm's state (and its log, swtpm.log)
	SerialFile   = "serial.log"  // the guest's serial console
	SerialSocket = "serial.sock" // the same console to type into, beside QMPSocket
	QEMULogFile  = "qemu.log"    // QEMU's own output, with each command line
	QMPSocket    = "qmp.sock"    // QMP, if the path fits a Unix socket address

	provisionLogFile = "swtpm-provision.log"
	// permanentStateFile is what swtpm writes once a TPM exists: its
	// presence means the vTPM was created (and provisioned) before.
	permanentStateFile = "tpm2-00.permall"
)

// ErrExited is returned by commands to a VM whose QEMU is no longer running.
var ErrExited = errors.New("VM is not running")

// Config describes a VM. Either Image (UEFI boot) or Kernel (direct boot)
// must be set.
type Config struct {
	// Name names the VM in QEMU (process title, QMP) and in errors.
	Name string
	// Dir is the VM's own directory, created if missing: overlay disk,
	// state disk, UEFI variables, TPM state, logs and sockets. Files left
	// by an earlier start are reused, so a restart keeps the VM's disks and
	// TPM, as a reboot would.
	Dir string
	// CPUs and MemoryMiB size the VM; zero means 2 CPUs and 1024 MiB.
	CPUs      int
	MemoryMiB int
	// Accel is the accelerator, see Probe; the zero value means AccelTCG.
	Accel Accel

	// Image is the base disk image (raw or qcow2) the VM boots with UEFI.
	// The VM writes to a qcow2 overlay of it in Dir; Image itself is never
	// changed, so one image serves many VMs.
	Image string
	// Firmware is the UEFI firmware for Image boots; the zero value means
	// DefaultFirmware(). Kernel boots do not use it (QEMU's SeaBIOS loads
	// the kernel faster).
	Firmware Firmware

	// Kernel, Initrd (optional) and Cmdline boot a kernel directly, for
	// tests.
	Kernel, Initrd, Cmdline string

	// StateDiskMiB > 0 adds a blank qcow2 state disk of that size, the
	// second virtio disk, with serial "state" (/dev/disk/by-id/virtio-state).
	StateDiskMiB int
	// AppendSerialLog adds this start's console to the serial log of the
	// VM's earlier starts instead of starting it afresh, as for a VM
	// powered on again with its disks.
	AppendSerialLog bool
	// Net attaches the VM to an existing tap device; nil means no network.
	Net *NetConfig
	// ExecPrefix is prepended to QEMU's command line, e.g.
	// {"ip", "netns", "exec", "ns"} to run it in a network namespace. The
	// prefix must exec QEMU in its own process (ip netns exec does), so
	// that the PID, signals and the parent-death signal reach QEMU.
	ExecPrefix []string
	// TPMNice is the CPU niceness of the VM's swtpm relative to this
	// process; give it the VM's own. The guest's TPM driver times out
	// commands that take seconds: with swtpm at the default niceness
	// under three emulated control planes at -5, cp-0's kernel logged
	// "tpm tpm0: Operation Timed out" three times in its first 12 min.
	// Without the right to raise priority (CAP_SYS_NICE) swtpm stays at
	// this process's niceness, as nice(1) leaves QEMU.
	TPMNice int
	// ProvisionTPM, if set, is called once with the freshly created vTPM
	// before the VM's first boot (the harness provisions the attestation
	// key here). A Dir whose TPM already exists skips it.
	ProvisionTPM func(rw io.ReadWriter) error
}

// NetConfig attaches a VM to a tap device that already exists; QEMU opens
// it and never runs scripts to configure it.
type NetConfig struct {
	Tap string
	MAC net.HardwareAddr // the zero value lets QEMU pick one
}

// Firmware is a split OVMF build: read-only code and the template of the
// variable store, of which each VM gets its own copy.
type Firmware struct {
	Code string
	Vars string
}

// DefaultFirmware is Debian's OVMF (package ovmf), without Secure Boot.
func DefaultFirmware() Firmware {
	return Firmware{
		Code: "/usr/share/OVMF/OVMF_CODE_4M.fd",
		Vars: "/usr/share/OVMF/OVMF_VARS_4M.fd",
	}
}

// VM is a running (or ended) VM.
type VM struct {
	cfg        Config
	qmpPath    string
	serialPath string // the serial console's socket
	sockDir    string // a short directory for the sockets, if Dir is too long
	cmd        *exec.Cmd
	tpm        *swtpm.QEMUInstance

	mu     sync.Mutex
	qmp    *qmp.Client // set once connected
	reaped bool        // QEMU has exited: a client connected now is closed at once

	exited  chan struct{} // closed after QEMU exited and cleanup ran
	waitErr error
	killed  atomic.Bool
}

// Start creates what the VM needs in cfg.Dir (disks, UEFI variables, a
// provisioned vTPM on first start), starts swtpm and QEMU and connects to
// QMP. ctx bounds the start only; the VM runs until it powers off or is
// stopped. On error, whatever Start had started is stopped and whatever it
// had created is removed, except logs.
func Start(ctx context.Context, cfg Config) (_ *VM, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	qemuPath, err := exec.LookPath(QEMUBinary)
	if err != nil {
		return nil, fmt.Errorf("%s not found in PATH: install it with 'make deps' (Debian package qemu-system-x86): %w", QEMUBinary, err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create VM directory: %w", err)
	}

	// undo holds what this Start created or started, to take back on error.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	created := func(path string) { undo = append(undo, func() { os.RemoveAll(path) }) }

	if err := prepareFiles(ctx, cfg, created); err != nil {
		return nil, err
	}
	if err := provisionTPM(ctx, cfg, created); err != nil {
		return nil, err
	}

	v := &VM{cfg: cfg, exited: make(chan struct{})}
	sockDir := cfg.Dir
	if len(filepath.Join(sockDir, SerialSocket)) >= maxSocketPath || len(filepath.Join(sockDir, QMPSocket)) >= maxSocketPath {
		// Unix socket paths are limited to 108 bytes: both sockets move
		// to a short directory, so that they are found together.
		if v.sockDir, err = os.MkdirTemp("", "orrery-vm-"); err != nil {
			return nil, fmt.Errorf("create socket directory: %w", err)
		}
		sockDir = v.sockDir
	}
	v.qmpPath = filepath.Join(sockDir, QMPSocket)
	v.serialPath = filepath.Join(sockDir, SerialSocket)
	undo = append(undo, v.removeSockets)
	// Stale sockets of a crashed run would keep QEMU from binding; only
	// the sockets, not the fresh directory they may be in.
	os.Remove(v.qmpPath)
	os.Remove(v.serialPath)

	v.tpm, err = swtpm.StartForQEMU(ctx, filepath.Join(cfg.Dir, TPMDir))
	if err != nil {
		return nil, fmt.Errorf("start vTPM of VM %s: %w", cfg.Name, err)
	}
	undo = append(undo, func() { _ = v.tpm.Stop() })
	if cfg.TPMNice != 0 {
		_ = renice(v.tpm.PID(), cfg.TPMNice)
	}

	if err := v.startQEMU(qemuPath); err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = v.Kill() })

	if err := v.connectQMP(ctx); err != nil {
		return nil, err
	}
	return v, nil
}

// maxSocketPath is the longest path a Unix socket address holds, with its
// terminating NUL.
const maxSocketPath = 108

func (c *Config) setDefaults() error {
	switch {
	case c.Name == "":
		return errors.New("vm: no name given")
	case c.Dir == "":
		return fmt.Errorf("vm %s: no directory given", c.Name)
	case c.Image == "" && c.Kernel == "":
		return fmt.Errorf("vm %s: neither an image nor a kernel to boot", c.Name)
	case c.Image != "" && c.Kernel != "":
		return fmt.Errorf("vm %s: give an image or a kernel, not both", c.Name)
	case c.CPUs < 0 || c.MemoryMiB < 0 || c.StateDiskMiB < 0:
		return fmt.Errorf("vm %s: negative CPUs, memory or state disk size", c.Name)
	case c.Net != nil && c.Net.Tap == "":
		return fmt.Errorf("vm %s: network without a tap device", c.Name)
	}
	if c.CPUs == 0 {
		c.CPUs = 2
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 1024
	}
	switch c.Accel {
	case "":
		c.Accel = AccelTCG
	case AccelKVM, AccelTCG:
	default:
		return fmt.Errorf("vm %s: unknown accelerator %q (want %s or %s)", c.Name, c.Accel, AccelKVM, AccelTCG)
	}
	switch {
	case c.Image == "":
		c.Firmware = Firmware{} // unused: not required to exist
	case c.Firmware == (Firmware{}):
		c.Firmware = DefaultFirmware()
	}
	// Absolute paths: QEMU and swtpm may run elsewhere (ExecPrefix), and
	// a VM's processes are found by its directory on their command lines.
	var err error
	for _, p := range []*string{&c.Dir, &c.Image, &c.Kernel, &c.Initrd, &c.Firmware.Code, &c.Firmware.Vars} {
		if *p == "" {
			continue
		}
		if *p, err = filepath.Abs(*p); err != nil {
			return fmt.Errorf("vm %s: %w", c.Name, err)
		}
	}
	for _, p := range []struct{ path, what string }{
		{c.Image, "disk image"},
		{c.Kernel, "kernel"},
		{c.Initrd, "initrd"},
		{c.Firmware.Code, "UEFI firmware (install Debian package ovmf: make deps)"},
		{c.Firmware.Vars, "UEFI variable store template (install Debian package ovmf: make deps)"},
	} {
		if p.path == "" {
			continue
		}
		if _, err := os.Stat(p.path); err != nil {
			return fmt.Errorf("vm %s: %s: %w", c.Name, p.what, err)
		}
	}
	return nil
}

// prepareFiles creates the disks and the UEFI variable store unless a
// previous start left them, reporting each new file to created.
func prepareFiles(ctx context.Context, cfg Config, created func(string)) error {
	if cfg.Image != "" {
		overlay := filepath.Join(cfg.Dir, OverlayFile)
		if !exists(overlay) {
			if err := createOverlay(ctx, overlay, cfg.Image); err != nil {
				return fmt.Errorf("vm %s: %w", cfg.Name, err)
			}
			created(overlay)
		}
		vars := filepath.Join(cfg.Dir, VarsFile)
		if !exists(vars) {
			if err := copyFile(vars, cfg.Firmware.Vars); err != nil {
				return fmt.Errorf("vm %s: copy UEFI variable store: %w", cfg.Name, err)
			}
			created(vars)
		}
	}
	if cfg.StateDiskMiB > 0 {
		state := filepath.Join(cfg.Dir, StateFile)
		if !exists(state) {
			if err := createBlank(ctx, state, cfg.StateDiskMiB); err != nil {
				return fmt.Errorf("vm %s: %w", cfg.Name, err)
			}
			created(state)
		}
	}
	return nil
}

// provisionTPM creates the vTPM and hands it to cfg.ProvisionTPM, unless
// the TPM exists already. It works in a directory of its own and renames it
// into place only on success, so that a failed provisioning is retried by
// the next start instead of being taken for a provisioned TPM.
func provisionTPM(ctx context.Context, cfg Config, created func(string)) (err error) {
	tpmDir := filepath.Join(cfg.Dir, TPMDir)
	if cfg.ProvisionTPM == nil || exists(filepath.Join(tpmDir, permanentStateFile)) {
		return nil
	}
	tmp := filepath.Join(cfg.Dir, TPMDir+".provision")
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("vm %s: remove leftover TPM: %w", cfg.Name, err)
	}
	// Keep swtpm's log of the provisioning beside the other logs, whatever
	// happens to the TPM.
	keepLog := func() { _ = os.Rename(filepath.Join(tmp, "swtpm.log"), filepath.Join(cfg.Dir, provisionLogFile)) }
	defer func() {
		if err != nil {
			keepLog()
			os.RemoveAll(tmp)
		}
	}()
	in, err := swtpm.Start(ctx, tmp)
	if err != nil {
		return fmt.Errorf("vm %s: create vTPM: %w", cfg.Name, err)
	}
	rw, err := in.Open()
	if err != nil {
		_ = in.Stop()
		return fmt.Errorf("vm %s: open new vTPM: %w", cfg.Name, err)
	}
	perr := cfg.ProvisionTPM(rw)
	rw.Close()
	// Stop saves the TPM's state: it must finish before QEMU's swtpm
	// reads it.
	_ = in.Stop()
	keepLog()
	if perr != nil {
		return fmt.Errorf("vm %s: provision vTPM: %w", cfg.Name, perr)
	}
	if err := os.RemoveAll(tpmDir); err != nil {
		return fmt.Errorf("vm %s: remove unprovisioned TPM: %w", cfg.Name, err)
	}
	if err := os.Rename(tmp, tpmDir); err != nil {
		return fmt.Errorf("vm %s: move provisioned TPM into place: %w", cfg.Name, err)
	}
	created(tpmDir)
	return nil
}

func (v *VM) startQEMU(qemuPath string) error {
	argv := append(append([]string{}, v.cfg.ExecPrefix...), qemuPath)
	argv = append(argv, qemuArgs(v.cfg, v.tpm.CtrlSocket(), v.qmpPath, v.serialPath)...)

	logPath := filepath.Join(v.cfg.Dir, QEMULogFile)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("vm %s: open QEMU log: %w", v.cfg.Name, err)
	}
	defer logf.Close()
	// The log tells what ran, one start after the other.
	fmt.Fprintf(logf, "=== %s: %s\n", time.Now().Format(time.RFC3339), strings.Join(argv, " "))

	v.cmd = exec.Command(argv[0], argv[1:]...) //nolint:noctx // a VM outlives the call that boots it; Stop and Kill end it
	v.cmd.Stdout = logf
	v.cmd.Stderr = logf
	// SIGKILL if we die, so that no VM outlives the harness that owns it
	// (its disks are scratch space or get replaced); its own process group
	// keeps a terminal's Ctrl-C from killing it behind the harness's back.
	// Pdeathsig is bound to the thread that forks, which the Go runtime
	// ends when a goroutine locked to it returns (netenv.Network.Do):
	// childproc forks from a thread that lives as long as QEMU.
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	wait, err := childproc.Start(v.cmd)
	if err != nil {
		return fmt.Errorf("vm %s: start QEMU: %w", v.cfg.Name, err)
	}
	go v.reap(wait)
	return nil
}

// reap waits for QEMU and then tears down what belongs to the VM: QMP,
// swtpm (which stays after QEMU was killed) and the sockets.
func (v *VM) reap(wait <-chan error) {
	v.waitErr = <-wait
	v.mu.Lock()
	v.reaped = true
	c := v.qmp
	v.mu.Unlock()
	if c != nil {
		c.Close()
	}
	_ = v.tpm.Stop()
	v.removeSockets()
	close(v.exited)
}

func (v *VM) removeSockets() {
	if v.sockDir != "" {
		os.RemoveAll(v.sockDir)
		return
	}
	os.Remove(v.qmpPath)
	os.Remove(v.serialPath)
}

func (v *VM) connectQMP(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		// The socket exists once QEMU has set up its chardevs; until then,
		// or while QEMU exits for a bad argument, keep trying.
		if exists(v.qmpPath) {
			c, err := qmp.Dial(ctx, v.qmpPath)
			if err == nil {
				v.mu.Lock()
				v.qmp = c
				reaped := v.reaped
				v.mu.Unlock()
				if !reaped {
					return nil
				}
				c.Close()
			}
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("vm %s: connect to QMP: %w", v.cfg.Name, err)
			}
		}
		select {
		case <-v.exited:
			return fmt.Errorf("vm %s: QEMU exited during start-up (%v): %s (see %s)", v.cfg.Name, v.waitErr, v.qemuLogTail(), filepath.Join(v.cfg.Dir, QEMULogFile))
		case <-ctx.Done():
			return fmt.Errorf("vm %s: QEMU did not open its QMP socket in time: %w", v.cfg.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// qemuLogTail is the end of QEMU's log: where it says why it failed.
func (v *VM) qemuLogTail() string {
	raw, _ := os.ReadFile(filepath.Join(v.cfg.Dir, QEMULogFile))
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var tail []string
	// The lines after the last start's command line.
	for i := len(lines) - 1; i >= 0 && !strings.HasPrefix(lines[i], "=== "); i-- {
		tail = append([]string{lines[i]}, tail...)
	}
	if len(tail) > 10 {
		tail = tail[len(tail)-10:]
	}
	if len(tail) == 0 {
		return "QEMU printed nothing"
	}
	return strings.Join(tail, "; ")
}

// Name is the VM's name.
func (v *VM) Name() string { return v.cfg.Name }

// Dir is the VM's directory.
func (v *VM) Dir() string { return v.cfg.Dir }

// PID is QEMU's process ID.
func (v *VM) PID() int { return v.cmd.Process.Pid }

// SerialLog is the path of the guest's serial console log. QEMU starts it
// afresh at every start of the VM (not at a guest reboot).
func (v *VM) SerialLog() string { return filepath.Join(v.cfg.Dir, SerialFile) }

// ConsoleSocket is the path of the Unix socket on which QEMU serves the
// guest's serial console: what a client writes is the guest's input, and
// it reads what the guest writes from the moment it connects (SerialLog
// has all of it). QEMU serves one client at a time; a second waits until
// the first has gone. A client should read all the time it is connected:
// QEMU holds the guest's output back while the socket is full. The socket
// is in the host's file system, so it works from any network namespace.
func (v *VM) ConsoleSocket() string { return v.serialPath }

// QMP is the VM's QMP connection, for commands this package has no method
// for. It is closed when QEMU exits.
func (v *VM) QMP() *qmp.Client {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.qmp
}

// Exited is closed once QEMU has exited and the VM's swtpm is stopped.
func (v *VM) Exited() <-chan struct{} { return v.exited }

func (v *VM) running() error {
	select {
	case <-v.exited:
		return fmt.Errorf("vm %s: %w", v.cfg.Name, ErrExited)
	default:
		return nil
	}
}

// Status is QEMU's run state of the guest: "running", "paused",
// "shutdown", ...
func (v *VM) Status(ctx context.Context) (string, error) {
	if err := v.running(); err != nil {
		return "", err
	}
	status, _, err := v.QMP().QueryStatus(ctx)
	if err != nil {
		return "", v.commandError(err)
	}
	return status, nil
}

// Reset resets the VM: the guest reboots at once, without shutting down;
// the vTPM is reset with it (its PCRs start from zero).
func (v *VM) Reset(ctx context.Context) error {
	if err := v.running(); err != nil {
		return err
	}
	if err := v.QMP().SystemReset(ctx); err != nil {
		return v.commandError(err)
	}
	return nil
}

// commandError explains a QMP failure by the VM's exit where that is the
// cause.
func (v *VM) commandError(err error) error {
	if errors.Is(err, qmp.ErrClosed) {
		select {
		case <-v.exited:
			return fmt.Errorf("vm %s: %w", v.cfg.Name, ErrExited)
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("vm %s: %w", v.cfg.Name, err)
}

// PowerDown presses the VM's power button and waits up to timeout for the
// guest to shut down; a guest that does not (or ctx ending first) is
// killed. It returns once the VM has ended, nil however it ended; a VM
// that has already ended is fine.
func (v *VM) PowerDown(ctx context.Context, timeout time.Duration) error {
	if v.running() != nil {
		return nil
	}
	// An error here means QEMU is going away already or cannot be asked:
	// either way, waiting and then killing is what is left to do.
	_ = v.QMP().SystemPowerdown(ctx)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-v.exited:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	return v.Kill()
}

// Kill ends the VM at once, like pulling its power plug, and waits until
// QEMU and swtpm are gone.
func (v *VM) Kill() error {
	if v.running() != nil {
		return nil
	}
	v.killed.Store(true)
	// Through os.Process, which knows when QEMU is gone, never a PID that
	// might be reused by now.
	if err := v.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("vm %s: kill QEMU: %w", v.cfg.Name, err)
	}
	<-v.exited
	return nil
}

// Wait waits until the VM has ended (or ctx ends) and tells how: nil when
// the guest powered off or the VM was stopped with Kill or PowerDown, an
// error when QEMU failed or was killed by someone else.
func (v *VM) Wait(ctx context.Context) error {
	select {
	case <-v.exited:
	case <-ctx.Done():
		return ctx.Err()
	}
	if v.waitErr == nil || v.killed.Load() {
		return nil
	}
	return fmt.Errorf("vm %s: QEMU ended: %w: %s", v.cfg.Name, v.waitErr, v.qemuLogTail())
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}
