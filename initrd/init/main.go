// Command init is the node's initrd /init (PID 1 until the switch to the
// OS). It loads the kernel modules it needs, measures "enter-initrd" into
// PCR 11, opens the dm-verity root filesystem with the root hash from the
// measured kernel command line, measures "leave-initrd", prepares the
// encrypted state disk (first boot: formats it; later boots: gets its key
// from a join service or the owner and locks the node to its cluster) and
// switches root to /sbin/init of the root filesystem.
//
// Every step logs one line "orrery-init: <step>: ..." to the console. A
// failed step logs why and powers off or reboots (orrery.onfailure); there
// is never a shell. See README.md for the contract with the image.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/u-root/u-root/pkg/mount"
	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/initrd/internal/clockcheck"
	"github.com/orrery-dev/orrery/initrd/internal/cmdline"
	"github.com/orrery-dev/orrery/initrd/internal/modules"
	"github.com/orrery-dev/orrery/initrd/internal/statedisk"
	"github.com/orrery-dev/orrery/initrd/internal/verity"
	"github.com/orrery-dev/orrery/internal/disk/blockdev"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
)

const (
	sysroot = "/sysroot"
	// measurePCR is the PCR of the initrd's phase markers.
	measurePCR = 11
	tpmDevice  = "/dev/tpmrm0"
	// Timeouts for devices to appear after their drivers load.
	tpmTimeout  = 5 * time.Second
	diskTimeout = 10 * time.Second
)

// Phase markers measured into PCR 11.
const (
	EnterInitrd = "enter-initrd"
	LeaveInitrd = "leave-initrd"
)

func main() {
	c := &console{start: time.Now()}
	onFailure := cmdline.PowerOff
	err := run(c, &onFailure)
	// run returns only on failure: on success it has exec'd the OS's init.
	if err == nil {
		err = errors.New("switch root returned")
	}
	fail(c, err, onFailure)
}

// stepError names the step that failed.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func step(name string, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{name, err}
}

// boot is what the initrd's phases hand each other.
type boot struct {
	c         *console
	onFailure *cmdline.OnFailure
	cfg       cmdline.Config
	tpm       *os.File
	mlog      *pcrlog.Log
	tool      *cryptsetup.Tool
}

// phases are the initrd's steps, in order, each with the name its errors
// and console lines carry.
var phases = []struct {
	name string
	run  func(*boot, context.Context) error
}{
	{"mount", func(*boot, context.Context) error { return mountEarly() }},
	// First: every later step's timeouts, and the certificates a rejoin
	// checks, need a clock that keeps time.
	{"clock", (*boot).checkClock},
	{"cmdline", (*boot).readCmdline},
	{"modules", (*boot).loadModules},
	{"tpm", (*boot).openTPM},
	{"measure", (*boot).enterInitrd},
	{"root", (*boot).openRoot},
	// PCR 11 takes its final value before the initrd reads anything
	// from outside (state disk, network): a rejoining node attests with
	// the PCR 11 its image predicts, as the join service and the owner
	// expect, and the same value the join services' own nodes show.
	{"measure", (*boot).leaveInitrd},
	{"state", (*boot).prepareState},
	{"switch-root", (*boot).switchRoot},
}

func run(c *console, onFailure *cmdline.OnFailure) error {
	// The kernel starts /init without PATH; the tools are in /usr/sbin.
	os.Setenv("PATH", "/usr/sbin:/usr/bin")
	b := &boot{c: c, onFailure: onFailure, mlog: &pcrlog.Log{Path: pcrlog.DefaultPath}, tool: &cryptsetup.Tool{}}
	defer b.closeTPM()
	ctx := context.Background()
	for _, p := range phases {
		if err := p.run(b, ctx); err != nil {
			return step(p.name, err)
		}
	}
	return nil
}

func (b *boot) checkClock(context.Context) error {
	b.c.log("start", "orrery initrd, kernel up for %s", uptime())
	t := time.Now()
	res, err := clockcheck.Check()
	b.c.log("clock", "%s (%s)", clockReport(res, err), since(t))
	return nil
}

func (b *boot) readCmdline(context.Context) error {
	raw, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	cfg, err := cmdline.Parse(string(raw))
	if cfg.OnFailure != "" {
		*b.onFailure = cfg.OnFailure
	}
	if err != nil {
		return err
	}
	b.cfg = cfg
	b.c.log("cmdline", "root hash %s, on failure %s", cfg.RootHashHex(), cfg.OnFailure)
	return nil
}

func (b *boot) loadModules(context.Context) error {
	t := time.Now()
	n, drivers, err := modules.Load()
	if err != nil {
		return err
	}
	b.c.log("modules", "loaded %d modules and their dependencies in %s", n, since(t))
	// A guest driver that finds no hardware is no failure: a node learns
	// its platform later, and attestation refuses a node that claims
	// hardware it lacks. The console says what was there.
	for _, d := range drivers {
		b.c.log("modules", "confidential-guest driver %s", d)
	}
	return nil
}

func (b *boot) openTPM(ctx context.Context) error {
	tpm, err := openTPM(ctx)
	b.tpm = tpm
	return err
}

func (b *boot) closeTPM() {
	if b.tpm != nil {
		b.tpm.Close()
		b.tpm = nil
	}
}

func (b *boot) measure(marker string) error {
	t := time.Now()
	if err := b.mlog.Measure(b.tpm, measurePCR, []byte(marker), marker); err != nil {
		return err
	}
	b.c.log("measure", "extended PCR %d with %q in %s", measurePCR, marker, since(t))
	return nil
}

func (b *boot) enterInitrd(context.Context) error { return b.measure(EnterInitrd) }

// leaveInitrd also closes the TPM: what follows opens its own.
func (b *boot) leaveInitrd(context.Context) error {
	defer b.closeTPM()
	return b.measure(LeaveInitrd)
}

func (b *boot) openRoot(ctx context.Context) error { return openRoot(ctx, b.c, b.tool, b.cfg) }

func (b *boot) prepareState(ctx context.Context) error {
	return prepareState(ctx, b.c, b.tool, b.mlog)
}

func (b *boot) switchRoot(context.Context) error {
	b.c.log("switch-root", "initrd done in %s; starting /sbin/init of the root filesystem", since(b.c.start))
	return mount.SwitchRoot(sysroot, "/sbin/init")
}

// mountEarly mounts the kernel's filesystems and a tmpfs on /run, which
// moves into the OS (the measurement log and the first-boot key live
// there).
func mountEarly() error {
	for _, m := range []struct {
		source, target, fstype string
		flags                  uintptr
		data                   string
	}{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		// The kernel's copy of the firmware's event log, for attestation.
		{"securityfs", "/sys/kernel/security", "securityfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	// cryptsetup keeps its locks here and warns without it.
	return os.MkdirAll("/run/cryptsetup", 0o700)
}

// openTPM waits for the TPM's resource manager device to appear.
func openTPM(ctx context.Context) (*os.File, error) {
	_, err := blockdev.Wait(ctx, tpmTimeout, 50*time.Millisecond, func() (string, error) {
		if _, err := os.Stat(tpmDevice); err != nil {
			return "", fmt.Errorf("%s: %w", tpmDevice, blockdev.ErrNotFound)
		}
		return tpmDevice, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no TPM (a node needs a TPM 2.0 or vTPM): %w", err)
	}
	return os.OpenFile(tpmDevice, os.O_RDWR, 0)
}

func openRoot(ctx context.Context, c *console, tool *cryptsetup.Tool, cfg cmdline.Config) error {
	t := time.Now()
	var data, hash string
	var err error
	for _, p := range []struct {
		dev  *string
		name string
	}{{&data, verity.RootPartName}, {&hash, verity.VerityPartName}} {
		*p.dev, err = blockdev.Wait(ctx, diskTimeout, 50*time.Millisecond, func() (string, error) {
			return blockdev.ByPartName("/sys", p.name)
		})
		if err != nil {
			return fmt.Errorf("find the root filesystem: %w (the boot disk needs GPT partitions %q and %q)", err, verity.RootPartName, verity.VerityPartName)
		}
	}
	if err := os.MkdirAll(sysroot, 0o755); err != nil {
		return err
	}
	root := &verity.Root{Tool: tool, Mount: unix.Mount, Probe: "sbin/init"}
	if err := root.Open(ctx, data, hash, cfg.RootHashHex(), sysroot); err != nil {
		return err
	}
	c.log("root", "%s (hash tree %s) verified and mounted read-only on %s in %s", data, hash, sysroot, since(t))
	return nil
}

func prepareState(ctx context.Context, c *console, tool *cryptsetup.Tool, mlog *pcrlog.Log) error {
	dev, err := blockdev.Wait(ctx, diskTimeout, 50*time.Millisecond, func() (string, error) {
		return blockdev.BySerial("/sys", handoff.Serial)
	})
	if errors.Is(err, blockdev.ErrNotFound) {
		return fmt.Errorf("no state disk: attach a blank virtual disk with serial %q", handoff.Serial)
	}
	if err != nil {
		return err
	}
	c.log("state", "state disk is %s", dev)
	p := &statedisk.Preparer{LUKS: tool, Mkfs: statedisk.E2fs{}, Mount: unix.Mount, Sysroot: sysroot}
	res, err := p.Prepare(ctx, dev)
	if errors.Is(err, statedisk.ErrInitialised) {
		return unlockState(ctx, c, tool, mlog, dev)
	}
	if err != nil {
		return err
	}
	if res.Abandoned {
		c.log("state", "%s was formatted at an earlier boot that never joined a cluster; its only key was lost with that boot's /run, so it holds nothing readable: preparing it afresh", dev)
	}
	c.log("state", "first boot: formatted LUKS2 in %s, opened in %s, created ext4 in %s; mounted on %s/var, /etc from the image with a tmpfs layer; passphrase in %s",
		res.FormatTime.Round(time.Millisecond), res.OpenTime.Round(time.Millisecond), res.MkfsTime.Round(time.Millisecond), sysroot, handoff.KeyFile)
	return nil
}

// fail reports err and powers off or reboots. It never returns and never
// starts a shell.
func fail(c *console, err error, action cmdline.OnFailure) {
	name := "boot"
	var se *stepError
	if errors.As(err, &se) {
		name, err = se.step, se.err
	}
	c.log(name, "FAILED: %s", strings.ReplaceAll(err.Error(), "\n", " "))
	c.log("failure", "%s in 2 s (orrery.onfailure=%s)", action, action)
	unix.Sync()
	time.Sleep(2 * time.Second)
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	if action == cmdline.Reboot {
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	if err := unix.Reboot(cmd); err != nil {
		c.log("failure", "%s failed: %v; halting", action, err)
	}
	for {
		time.Sleep(time.Hour)
	}
}

// console writes the initrd's log lines to the console (PID 1's stdout),
// each with the time since /init started, and keeps them for the owner's
// inspect service.
type console struct {
	start time.Time
	kept  lineLog
}

func (c *console) log(step, format string, args ...any) {
	now := time.Now()
	text := step + ": " + fmt.Sprintf(format, args...)
	c.kept.add(now, text)
	fmt.Fprintf(os.Stdout, "orrery-init: %s [+%.3fs]\n", text, now.Sub(c.start).Seconds())
}

// clockReport says what clockcheck.Check found and did. A clock that could
// not be checked does not stop the boot: most machines keep time.
func clockReport(res clockcheck.Result, err error) string {
	var msg string
	switch {
	case res.Switched:
		msg = fmt.Sprintf("clock source %s %s against the HPET (the kernel misjudged the TSC's frequency at boot): switched to hpet, which runs at %.3fx", res.Source, clockcheck.Describe(res.Rate), res.After)
		if !res.Time.IsZero() {
			msg += ", and set the time from the RTC to " + res.Time.Format(time.RFC3339)
		}
	case res.Rate != 0:
		msg = fmt.Sprintf("clock source %s %s (HPET)", res.Source, clockcheck.Describe(res.Rate))
	case err == nil:
		msg = fmt.Sprintf("clock source %s, nothing to check", res.Source)
	}
	if err != nil {
		if msg != "" {
			return msg + "; " + err.Error()
		}
		return "not checked: " + err.Error()
	}
	return msg
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

// uptime is the kernel's uptime from /proc/uptime: the time from kernel
// start to /init.
func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0] + "s"
}
