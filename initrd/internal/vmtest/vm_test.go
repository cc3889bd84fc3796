package vmtest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/initrd/internal/initrdbuild"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup/headertest"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/nodepackages"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
)

// bootTimeout bounds one boot under TCG, first-boot disk formatting
// included. A boot takes 7-25 s alone; CI runs this package beside
// others on two cores, with the race detector in the host-side servers,
// and a starved guest has been seen to need over 3 minutes.
const bootTimeout = 6 * time.Minute

// cmdline is the kernel command line of every test boot: the UKI's, with
// the fixture's root hash. tsc=reliable as in image/build.sh: QEMU's TCG
// CPU has no invariant TSC, and the HPET Linux falls back to costs every
// timer read a trap.
func cmdline(f fixture) string {
	return "console=ttyS0 panic=-1 tsc=reliable orrery.roothash=" + f.rootHash + " orrery.onfailure=poweroff"
}

// fixture is what every boot shares: kernel, initrd, root disk.
type fixture struct {
	kernel, initrd string
	rootDisk       string // GPT: orrery-root (erofs) + orrery-verity
	rootHash       string
	rootStart      int64 // byte offset of the root partition
}

var (
	setupOnce sync.Once
	shared    fixture
	setupErr  error
	setupDir  string
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(pipeEnv); addr != "" {
		os.Exit(pipe(addr))
	}
	code := m.Run()
	if setupDir != "" {
		os.RemoveAll(setupDir)
	}
	os.Exit(code)
}

func setup(t *testing.T) fixture {
	t.Helper()
	if testing.Short() {
		t.Skip("boots VMs; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (device nodes in the guest's disks, swtpm)")
	}
	for _, tool := range []string{vm.QEMUBinary, "qemu-img", "swtpm", "cryptsetup", "veritysetup", "mkfs.erofs", "sfdisk", "mke2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (make deps): %v", tool, err)
		}
	}
	setupOnce.Do(func() { shared, setupErr = build() })
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	return shared
}

func build() (f fixture, err error) {
	if setupDir, err = os.MkdirTemp("", "orrery-initrd-vmtest-"); err != nil {
		return f, err
	}
	k, err := nodepackages.Kernel()
	if err != nil {
		return f, err
	}
	f.kernel = k.Path
	var log bytes.Buffer
	start := time.Now()
	res, err := initrdbuild.Build(filepath.Join(setupDir, "initrd"), initrdbuild.Options{Kernel: k, Log: &log})
	if err != nil {
		return f, fmt.Errorf("build initrd: %w\n%s", err, log.String())
	}
	fmt.Printf("initrd: %.1f MB, built in %s\n", float64(res.Size)/1e6, time.Since(start).Round(time.Millisecond))
	f.initrd = res.Path

	// The root filesystem: testroot as /sbin/init and the mount points
	// the initrd needs.
	tree := filepath.Join(setupDir, "tree")
	for _, d := range []string{"sbin", "dev", "proc", "sys", "run", "var", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return f, err
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "etc", "hostname"), []byte("orrery-test\n"), 0o644); err != nil {
		return f, err
	}
	if err := run("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(tree, "sbin", "init"),
		"github.com/orrery-dev/orrery/initrd/internal/vmtest/testroot"); err != nil {
		return f, err
	}
	rootImg := filepath.Join(setupDir, "root.erofs")
	verityImg := filepath.Join(setupDir, "root.verity")
	if err := run("mkfs.erofs", "--quiet", "--all-root", rootImg, tree); err != nil {
		return f, err
	}
	out, err := output("veritysetup", "format", rootImg, verityImg)
	if err != nil {
		return f, err
	}
	m := regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`).FindStringSubmatch(out)
	if m == nil {
		return f, fmt.Errorf("no root hash in veritysetup output:\n%s", out)
	}
	f.rootHash = m[1]
	f.rootDisk = filepath.Join(setupDir, "root.img")
	f.rootStart, err = gptDisk(f.rootDisk, rootImg, verityImg)
	return f, err
}

// gptDisk writes a GPT disk with partitions orrery-root and orrery-verity
// holding the two images and returns the root partition's byte offset.
func gptDisk(path, rootImg, verityImg string) (int64, error) {
	const sector, align = 512, 1 << 20
	roundUp := func(n int64) int64 { return (n + align - 1) / align * align }
	sizeOf := func(p string) (int64, error) {
		fi, err := os.Stat(p)
		if err != nil {
			return 0, err
		}
		return roundUp(fi.Size()), nil
	}
	rootSize, err := sizeOf(rootImg)
	if err != nil {
		return 0, err
	}
	veritySize, err := sizeOf(verityImg)
	if err != nil {
		return 0, err
	}
	rootStart := int64(align)
	verityStart := rootStart + rootSize
	total := verityStart + veritySize + align
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return 0, err
	}
	if err := os.Truncate(path, total); err != nil {
		return 0, err
	}
	script := fmt.Sprintf("label: gpt\nstart=%d, size=%d, name=\"orrery-root\"\nstart=%d, size=%d, name=\"orrery-verity\"\n",
		rootStart/sector, rootSize/sector, verityStart/sector, veritySize/sector)
	cmd := exec.Command("sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", path)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("sfdisk: %v\n%s", err, out)
	}
	disk, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer disk.Close()
	for _, p := range []struct {
		img string
		at  int64
	}{{rootImg, rootStart}, {verityImg, verityStart}} {
		b, err := os.ReadFile(p.img)
		if err != nil {
			return 0, err
		}
		if _, err := disk.WriteAt(b, p.at); err != nil {
			return 0, err
		}
	}
	return rootStart, disk.Close()
}

func run(name string, args ...string) error {
	_, err := output(name, args...)
	return err
}

func output(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// boot starts a VM with the fixture's kernel and initrd, the given root
// disk (if any) and a state disk of stateMiB (0: none), in dir; extra
// goes on the kernel command line.
func boot(t *testing.T, f fixture, dir, rootDisk string, stateMiB int, extra ...string) *vm.VM {
	t.Helper()
	cfg := vm.Config{
		Name:         "initrd-" + filepath.Base(dir),
		Dir:          dir,
		Kernel:       f.kernel,
		Initrd:       f.initrd,
		Cmdline:      strings.Join(append([]string{cmdline(f)}, extra...), " "),
		StateDiskMiB: stateMiB,
	}
	if rootDisk != "" {
		// vm.Config attaches no extra disks; a shell in front of QEMU
		// appends the root disk to its command line and execs it.
		cfg.ExecPrefix = []string{"/bin/sh", "-c",
			`exec "$@" -drive if=none,id=rootdisk,format=raw,readonly=on,file=` + rootDisk +
				` -device virtio-blk-pci,drive=rootdisk`, "sh"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := vm.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Kill() })
	return v
}

// waitExit waits for the guest to power off and returns its console.
func waitExit(t *testing.T, v *vm.VM) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	err := v.Wait(ctx)
	console := readConsole(t, v)
	if err != nil {
		t.Fatalf("VM did not power off: %v\n%s", err, consoleReport(console))
	}
	return console
}

// waitFor waits until the console shows want.
func waitFor(t *testing.T, v *vm.VM, want string) string {
	t.Helper()
	deadline := time.Now().Add(bootTimeout)
	for time.Now().Before(deadline) {
		if c := readConsole(t, v); strings.Contains(c, want) {
			return c
		}
		select {
		case <-v.Exited():
			t.Fatalf("VM ended before printing %q\n%s", want, consoleReport(readConsole(t, v)))
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("no %q on the console after %s\n%s", want, bootTimeout, consoleReport(readConsole(t, v)))
	return ""
}

func readConsole(t *testing.T, v *vm.VM) string {
	b, err := os.ReadFile(v.SerialLog())
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// consoleReport is what a failure shows of a console: /init's lines, then
// the console's last lines (whatever ran after /init, or a kernel panic).
// Not the whole console: CI keeps only the head of a long failure, and
// the kernel's first 300 lines say nothing about why a boot hung.
func consoleReport(console string) string {
	const tail = 40
	lines := strings.Split(strings.TrimRight(console, "\n"), "\n")
	if len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	return "/init's lines:\n" + strings.Join(initLines(console), "\n") +
		fmt.Sprintf("\nthe console's last %d lines:\n", len(lines)) + strings.Join(lines, "\n")
}

// initLines returns the console lines of /init.
func initLines(console string) []string {
	var out []string
	for _, l := range strings.Split(console, "\n") {
		if i := strings.Index(l, "orrery-init: "); i >= 0 {
			out = append(out, strings.TrimRight(l[i:], "\r"))
		}
	}
	return out
}

// rootReports returns the values of the test root's "ORRERY-ROOT key"
// lines.
func rootReports(console, key string) []string {
	var out []string
	prefix := "ORRERY-ROOT " + key + " "
	for _, l := range strings.Split(console, "\n") {
		if i := strings.Index(l, prefix); i >= 0 {
			out = append(out, strings.TrimRight(l[i+len(prefix):], "\r"))
		}
	}
	return out
}

// TestFirstBootThenInitialised boots with a blank state disk (first boot:
// LUKS2, key, switch to the root), checks the disk and PCR 11 from
// outside; boots again with the same disk, which was never keyed to a
// cluster and is prepared afresh; then marks it keyed, and the next boot
// must wait for its key. Last (NullSegment), the host rewrites the keyed
// disk's header, and the next boot refuses the disk and powers off.
func TestFirstBootThenInitialised(t *testing.T) {
	f := setup(t)
	dir := filepath.Join(t.TempDir(), "vm")
	start := time.Now()
	v := boot(t, f, dir, f.rootDisk, 256)
	console := waitExit(t, v)
	wall := time.Since(start)
	lines := initLines(console)
	t.Logf("first boot: %s wall\n%s", wall.Round(time.Millisecond), strings.Join(lines, "\n"))

	checkClock(t, console, time.Now(), "tsc")
	for _, want := range []string{
		"orrery-init: start: ", "orrery-init: cmdline: root hash " + f.rootHash,
		"orrery-init: clock: clock source tsc runs at ",
		"orrery-init: modules: loaded",
		// The guest drivers are in the initrd and tried; QEMU's VM is no
		// confidential guest, which the node says.
		"orrery-init: modules: confidential-guest driver sev-guest: no such confidential-guest hardware on this VM",
		"orrery-init: modules: confidential-guest driver tdx-guest: no such confidential-guest hardware on this VM",
		`orrery-init: measure: extended PCR 11 with "enter-initrd"`,
		"orrery-init: root: ", "orrery-init: state: first boot: formatted LUKS2",
		`orrery-init: measure: extended PCR 11 with "leave-initrd"`, "orrery-init: switch-root: ",
		"ORRERY-ROOT done",
	} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	if errs := rootReports(console, "error"); len(errs) > 0 {
		t.Errorf("test root reported errors: %q", errs)
	}
	t.Logf("state disk writes: %s", strings.Join(rootReports(console, "io"), "; "))
	if got := rootReports(console, "key"); len(got) != 1 || got[0] != "32 400" {
		t.Errorf("first-boot key = %q, want 32 bytes, mode 400", got)
	}
	if got := rootReports(console, "writable"); len(got) != 2 {
		t.Errorf("writable = %q, want /etc and /var", got)
	}

	checkFirstBootPCR11(t, console)
	raw, dump := checkStateDiskIsLUKS2(t, dir, console)
	v2 := checkSecondBootFormatsAfresh(t, f, dir, v, raw, dump)
	checkKeyedDiskWaitsForKey(t, f, dir, raw, v2)
	t.Run("NullSegment", func(t *testing.T) { testNullSegment(t, f, dir, raw) })
}

// checkFirstBootPCR11 checks PCR 11 after the first boot (console).
func checkFirstBootPCR11(t *testing.T, console string) {
	t.Helper()
	// PCR 11: as the guest read it, as the log replays, and as computed
	// here from the phase markers alone.
	entries, err := pcrlog.Parse([]byte(strings.Join(rootReports(console, "log"), "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	replayed, err := pcrlog.Replay(entries, crypto.SHA256, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 32)
	for _, marker := range []string{"enter-initrd", "leave-initrd"} {
		d := sha256.Sum256([]byte(marker))
		s := sha256.Sum256(append(want, d[:]...))
		want = s[:]
	}
	got := rootReports(console, "pcr11")
	if len(got) != 1 || got[0] != hex.EncodeToString(want) || hex.EncodeToString(replayed[11]) != got[0] {
		t.Errorf("PCR 11: guest %q, log replay %x, expected %x", got, replayed[11], want)
	}
	if d := pcrlog.Describe(entries, 11); strings.Join(d, ",") != "enter-initrd,leave-initrd" {
		t.Errorf("log describes PCR 11 as %q", d)
	}
}

// checkStateDiskIsLUKS2 checks the state disk in dir after the first
// boot (console) and returns the path of its raw image and its luksDump.
func checkStateDiskIsLUKS2(t *testing.T, dir, console string) (raw, dump string) {
	t.Helper()
	// The state disk, from the host: LUKS2.
	raw = filepath.Join(t.TempDir(), "state.raw")
	if err := run("qemu-img", "convert", "-O", "raw", filepath.Join(dir, vm.StateFile), raw); err != nil {
		t.Fatal(err)
	}
	dump, err := output("cryptsetup", "luksDump", raw)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Version:\s+2$`).MatchString(dump) || !strings.Contains(dump, "pbkdf2") {
		t.Errorf("state disk is not LUKS2 with a pbkdf2 keyslot:\n%s", dump)
	}
	if !regexp.MustCompile(`(?m)^\s+integrity:\s+hmac\(sha256\)$`).MatchString(dump) {
		t.Errorf("state disk's data segment has no HMAC-SHA256 integrity:\n%s", dump)
	}
	// A sector read before it was ever written fails on a dm-integrity
	// volume that was not wiped: the kernel says so on the console.
	for _, bad := range []string{"INTEGRITY AEAD ERROR", "I/O error"} {
		if strings.Contains(console, bad) {
			t.Errorf("console shows %q: something read the state volume before writing it", bad)
		}
	}
	return raw, dump
}

// checkSecondBootFormatsAfresh boots again after the first boot (v) on
// the state disk in dir, whose raw image is raw and whose luksDump was
// dump, and returns the VM of this second boot.
func checkSecondBootFormatsAfresh(t *testing.T, f fixture, dir string, v *vm.VM, raw, dump string) *vm.VM {
	t.Helper()
	// Second boot: nothing keyed the disk to a cluster (no bootstrapper
	// ran), and its random passphrase is gone with the first boot's /run:
	// the initrd prepares it afresh.
	if err := os.Remove(v.SerialLog()); err != nil {
		t.Fatal(err)
	}
	v2 := boot(t, f, dir, f.rootDisk, 256)
	console := waitExit(t, v2)
	if !strings.Contains(console, "never joined a cluster") || !strings.Contains(console, "state: first boot: formatted LUKS2") {
		t.Errorf("second boot did not prepare the abandoned disk afresh:\n%s", strings.Join(initLines(console), "\n"))
	}
	if err := run("qemu-img", "convert", "-O", "raw", filepath.Join(dir, vm.StateFile), raw); err != nil {
		t.Fatal(err)
	}
	if again, err := output("cryptsetup", "luksUUID", raw); err != nil || strings.Contains(dump, strings.TrimSpace(again)) {
		t.Errorf("the disk was not formatted anew (UUID %q, %v)", again, err)
	}
	return v2
}

// checkKeyedDiskWaitsForKey marks the state disk in dir (raw image raw)
// keyed and boots again after the second boot (v2).
func checkKeyedDiskWaitsForKey(t *testing.T, f fixture, dir, raw string, v2 *vm.VM) {
	t.Helper()
	// Once keyed to a cluster (as bootstrapperd marks it), the disk is
	// the cluster's: the initrd asks for its key and never formats it.
	if err := run("cryptsetup", "config", "--label", handoff.KeyedLabel, raw); err != nil {
		t.Fatal(err)
	}
	if err := run("qemu-img", "convert", "-O", "qcow2", raw, filepath.Join(dir, vm.StateFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(v2.SerialLog()); err != nil {
		t.Fatal(err)
	}
	v3 := boot(t, f, dir, f.rootDisk, 256)
	console := waitFor(t, v3, "getting its key from the cluster")
	if strings.Contains(console, "FAILED") || strings.Contains(console, "switch-root") || strings.Contains(console, "formatted LUKS2") {
		t.Errorf("third boot went on:\n%s", strings.Join(initLines(console), "\n"))
	}
	if err := v3.Kill(); err != nil {
		t.Fatal(err)
	}
}

// testNullSegment rewrites the header of the keyed state disk raw (the
// raw image of the one in the VM directory dir) as the review's
// nullsegment.py does: the data segment in clear, without integrity,
// which the cluster's key would still open. The initrd must refuse the
// disk before it asks anyone for a key, name the field, and power off
// without switching to the OS.
func testNullSegment(t *testing.T, f fixture, dir, raw string) {
	headertest.Rewrite(t, raw, headertest.NullSegment)
	if err := run("qemu-img", "convert", "-O", "qcow2", raw, filepath.Join(dir, vm.StateFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, vm.SerialFile)); err != nil {
		t.Fatal(err)
	}
	console := waitExit(t, boot(t, f, dir, f.rootDisk, 256))
	t.Logf("console:\n%s", strings.Join(initLines(console), "\n"))
	refused := regexp.MustCompile(`orrery-init: state: FAILED: refusing the state disk: LUKS2 header of /dev/\w+: ` +
		`segments\.0\.encryption is "cipher_null-ecb", want "aes-xts-plain64"`)
	if !refused.MatchString(console) || !strings.Contains(console, "orrery-init: failure: poweroff") {
		t.Errorf("no refusal of the state disk that names segments.0.encryption, then power-off:\n%s", consoleReport(console))
	}
	for _, never := range []string{"getting its key", "orrery-init: network:", "orrery-init: switch-root:", "ORRERY-ROOT"} {
		if strings.Contains(console, never) {
			t.Errorf("the boot went on to %q with a refused state disk:\n%s", never, consoleReport(console))
		}
	}
}

// TestClockRunsTooFast boots with the TSC's frequency taken as 150 MHz,
// well below any host's, as a calibration disturbed under TCG leaves it
// (a stress run's worker took 2.3 GHz for 274 MHz): the guest's clock
// runs many times too fast. The initrd must see it, move the kernel to
// the HPET and set the time from the RTC, so that the OS starts with a
// clock that keeps time.
func TestClockRunsTooFast(t *testing.T) {
	f := setup(t)
	v := boot(t, f, filepath.Join(t.TempDir(), "vm"), f.rootDisk, 256, "tsc_early_khz=150000")
	console := waitExit(t, v)
	host := time.Now()
	lines := initLines(console)
	t.Logf("console:\n%s", strings.Join(lines, "\n"))
	if !strings.Contains(console, "tsc: Detected 150.000 MHz processor") {
		t.Fatalf("the kernel did not take the TSC's frequency from the command line:\n%s", consoleReport(console))
	}
	if !regexp.MustCompile(`orrery-init: clock: clock source tsc runs [0-9.]+ times too fast against the HPET .*: switched to hpet, which runs at 1\.0`).MatchString(console) ||
		!strings.Contains(console, "set the time from the RTC") {
		t.Errorf("no clock line that says the clock was put right:\n%s", strings.Join(lines, "\n"))
	}
	checkClock(t, console, host, "hpet")
}

// checkClock checks what the test root reported of the clock: the clock
// source, and a wall clock within a minute of the host's at power-off
// (host). A clock that ran 15 times too fast from the kernel's start to
// the OS would be minutes ahead.
func checkClock(t *testing.T, console string, host time.Time, source string) {
	t.Helper()
	if got := rootReports(console, "clocksource"); len(got) != 1 || got[0] != source {
		t.Errorf("the OS started with clock source %q, want %q", got, source)
	}
	got := rootReports(console, "time")
	if len(got) != 1 {
		t.Fatalf("the test root reported no time: %q", got)
	}
	sec, err := strconv.ParseInt(got[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Unix(sec, 0).Sub(host); d > 5*time.Second || d < -time.Minute {
		t.Errorf("the guest's clock was %s off the host's when the OS started (guest %s, host at power-off %s)",
			d.Round(time.Second), time.Unix(sec, 0).UTC().Format(time.RFC3339), host.UTC().Format(time.RFC3339))
	}
}

// TestNoStateDisk: without a state disk the initrd says what to attach
// and powers off.
func TestNoStateDisk(t *testing.T) {
	f := setup(t)
	v := boot(t, f, filepath.Join(t.TempDir(), "vm"), f.rootDisk, 0)
	console := waitExit(t, v)
	t.Logf("console:\n%s", strings.Join(initLines(console), "\n"))
	if !strings.Contains(console, "orrery-init: state: FAILED: no state disk: attach a blank virtual disk with serial \"state\"") ||
		!strings.Contains(console, "orrery-init: failure: poweroff") {
		t.Errorf("console:\n%s", strings.Join(initLines(console), "\n"))
	}
}

// TestTamperedRoot: one changed byte in the root partition stops the boot
// with a dm-verity message.
func TestTamperedRoot(t *testing.T) {
	f := setup(t)
	b, err := os.ReadFile(f.rootDisk)
	if err != nil {
		t.Fatal(err)
	}
	b[f.rootStart+1024+64] ^= 0xff // inside the erofs superblock
	tampered := filepath.Join(t.TempDir(), "root.img")
	if err := os.WriteFile(tampered, b, 0o644); err != nil {
		t.Fatal(err)
	}
	v := boot(t, f, filepath.Join(t.TempDir(), "vm"), tampered, 256)
	console := waitExit(t, v)
	t.Logf("console:\n%s", strings.Join(initLines(console), "\n"))
	if !strings.Contains(console, "orrery-init: root: FAILED: dm-verity: root filesystem does not match the measured root hash") ||
		strings.Contains(console, "orrery-init: state:") {
		t.Errorf("console:\n%s", strings.Join(initLines(console), "\n"))
	}
}
