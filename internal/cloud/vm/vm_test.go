package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/u-root/u-root/pkg/cpio"
	"go.uber.org/goleak"

	"github.com/orrery-dev/orrery/internal/nodepackages"
)

// guestMarker starts the line testdata/guestinit prints at every boot.
const guestMarker = "ORRERY-VMTEST boot "

// testKernel is the kernel the VM tests boot.
func testKernel(t *testing.T) string {
	t.Helper()
	kernel, err := nodepackages.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	return kernel.Path
}

var initrd struct {
	once sync.Once
	path string
	err  error
}

// testInitrd builds, once per test binary, an initramfs whose /init is
// testdata/guestinit, a static Go program.
func testInitrd(t *testing.T) string {
	t.Helper()
	initrd.once.Do(func() { initrd.path, initrd.err = buildInitrd() })
	if initrd.err != nil {
		t.Fatal(initrd.err)
	}
	return initrd.path
}

// initrdDir holds the built initramfs, if one was built; TestMain removes
// it.
var initrdDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if initrdDir != "" {
		os.RemoveAll(initrdDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "a test left goroutines behind: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func buildInitrd() (string, error) {
	var err error
	if initrdDir, err = os.MkdirTemp("", "vmtest-initrd-"); err != nil {
		return "", err
	}
	bin := filepath.Join(initrdDir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./testdata/guestinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the guest's /init: %w: %s", err, out)
	}
	init, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	path := filepath.Join(initrdDir, "initrd.cpio")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	w := cpio.Newc.Writer(f)
	records := []cpio.Record{
		cpio.Directory("dev", 0o755),
		// The kernel opens /dev/console for /init's stdio before any
		// devtmpfs is mounted.
		cpio.CharDev("dev/console", 0o600, 5, 1),
		cpio.Directory("proc", 0o755),
		cpio.Directory("sys", 0o755),
		cpio.StaticRecord(init, cpio.Info{Name: "init", Mode: cpio.S_IFREG | 0o755}),
	}
	if err := cpio.WriteRecords(w, records); err != nil {
		return "", fmt.Errorf("write initramfs: %w", err)
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return "", fmt.Errorf("write initramfs: %w", err)
	}
	return path, f.Close()
}

// waitForBoots waits until the serial log holds n boot markers and returns
// them.
func waitForBoots(t *testing.T, v *VM, n int, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		raw, _ := os.ReadFile(v.SerialLog())
		var boots []string
		for _, line := range strings.Split(string(raw), "\n") {
			if i := strings.Index(line, guestMarker); i >= 0 {
				boots = append(boots, strings.TrimSpace(line[i+len(guestMarker):]))
			}
		}
		if len(boots) >= n {
			return boots
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d boot markers after %v; serial log:\n%s", len(boots), n, timeout, tail(raw, 3000))
		}
		select {
		case <-v.Exited():
			t.Fatalf("VM exited while waiting for boot %d: %v; serial log:\n%s", n, v.Wait(context.Background()), tail(raw, 3000))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// processesIn lists the processes whose command line names dir: the VM's
// QEMU and swtpm, as the cloud's cleanup finds them.
func processesIn(dir string) []string {
	entries, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir+"/")) {
			continue
		}
		found = append(found, e.Name()+": "+string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return found
}

func checkNoProcesses(t *testing.T, dir string) {
	t.Helper()
	// A process may be a zombie for a moment after its parent's Wait.
	for range 50 {
		if len(processesIn(dir)) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("processes of the VM remain: %q", processesIn(dir))
}

// TestBoot boots Debian's cloud kernel with a Go /init under QEMU and
// swtpm, and drives it through QMP: the kernel finds the vTPM, QMP reports
// it running, a reset reboots it, a power-down of a guest that ignores the
// power button ends in a kill, and a restart reuses the provisioned TPM.
func TestBoot(t *testing.T) {
	kernel, initrd := testKernel(t), testInitrd(t)
	dir := filepath.Join(t.TempDir(), "vm0")
	t.Cleanup(func() { checkNoProcesses(t, dir) })

	// KVM where it works, so that the test is quick on a workstation.
	accel, why := Probe(context.Background(), kernel)
	t.Logf("accelerator: %s (%s)", accel, why)

	provisioned := 0
	cfg := bootConfig(dir, kernel, initrd, accel, &provisioned)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	start := time.Now()
	v, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Kill() })
	started := time.Since(start)
	boots := waitForBoots(t, v, 1, 30*time.Second)
	t.Logf("first start: Start returned after %v (TPM provisioned, swtpm and QEMU started, QMP connected); boot marker after %v: %s",
		started.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), boots[0])
	if provisioned != 1 {
		t.Errorf("ProvisionTPM ran %d times, want once", provisioned)
	}
	if !strings.Contains(boots[0], "tpm0=yes") {
		t.Errorf("the guest found no /dev/tpm0: %s", boots[0])
	}

	checkRunningWithStateDisk(t, ctx, v)

	reset := time.Now()
	if err := v.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	// Generous: under TCG with other VM tests running beside it, a reboot
	// has been seen to take most of 30 s.
	boots = waitForBoots(t, v, 2, 90*time.Second)
	t.Logf("reset to boot marker: %v: %s", time.Since(reset).Round(time.Millisecond), boots[1])
	if !strings.Contains(boots[1], "tpm0=yes") {
		t.Errorf("after the reset the guest found no /dev/tpm0: %s", boots[1])
	}

	// A Go /init does not handle the ACPI power button: PowerDown must
	// fall back to a kill after its timeout.
	checkPowerDownKills(t, ctx, v, dir)

	// A restart keeps the TPM: no second provisioning.
	start = time.Now()
	v, err = Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Kill() })
	boots = waitForBoots(t, v, 1, 30*time.Second)
	t.Logf("restart to boot marker: %v: %s", time.Since(start).Round(time.Millisecond), boots[0])
	if provisioned != 1 {
		t.Errorf("ProvisionTPM ran again on restart (%d times)", provisioned)
	}
	if err := v.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := v.Wait(ctx); err != nil {
		t.Errorf("Wait() after Kill = %v, want nil", err)
	}
}

// bootConfig is TestBoot's VM; its ProvisionTPM counts its runs in
// provisioned.
func bootConfig(dir, kernel, initrdPath string, accel Accel, provisioned *int) Config {
	return Config{
		Name:         "vmtest",
		Dir:          dir,
		CPUs:         2,
		MemoryMiB:    512,
		Accel:        accel,
		Kernel:       kernel,
		Initrd:       initrdPath,
		Cmdline:      "console=ttyS0 quiet",
		StateDiskMiB: 64,
		ProvisionTPM: func(rw io.ReadWriter) error {
			*provisioned++
			// A real command: the TPM works before the VM exists.
			_, err := tpm2.GetRandom(rw, 16)
			return err
		},
	}
}

// checkRunningWithStateDisk checks through QMP that v runs and has its
// state disk.
func checkRunningWithStateDisk(t *testing.T, ctx context.Context, v *VM) {
	t.Helper()
	status, err := v.Status(ctx)
	if err != nil || status != "running" {
		t.Fatalf("Status() = %q, %v; want running", status, err)
	}
	var blocks []struct {
		Device string `json:"device"`
	}
	if err := v.QMP().Execute(ctx, "query-block", nil, &blocks); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(blocks, func(b struct {
		Device string `json:"device"`
	}) bool {
		return b.Device == "state"
	}) {
		t.Errorf("QEMU has no state disk: query-block = %+v", blocks)
	}
}

// checkPowerDownKills powers down a guest that ignores the power button:
// v must end after PowerDown's timeout and leave no process behind.
func checkPowerDownKills(t *testing.T, ctx context.Context, v *VM, dir string) {
	t.Helper()
	down := time.Now()
	if err := v.PowerDown(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(down); d < time.Second || d > 10*time.Second {
		t.Errorf("PowerDown took %v, want its 1s timeout plus a little", d)
	}
	select {
	case <-v.Exited():
	default:
		t.Fatal("VM still running after PowerDown")
	}
	if err := v.Wait(ctx); err != nil {
		t.Errorf("Wait() after PowerDown = %v, want nil", err)
	}
	if _, err := v.Status(ctx); !errors.Is(err, ErrExited) {
		t.Errorf("Status() of an ended VM: error = %v, want ErrExited", err)
	}
	checkNoProcesses(t, dir)
}

// TestConsoleSocket boots the test guest from a directory too long for a
// Unix socket address: the console's socket must move to a short directory
// beside QMP's, bring a connected client what the guest writes while the
// log keeps it too, leave the log whole after the client has gone, and
// disappear with the VM.
func TestConsoleSocket(t *testing.T) {
	kernel, initrd := testKernel(t), testInitrd(t)
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", maxSocketPath), "vm2")
	t.Cleanup(func() { checkNoProcesses(t, dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	v, err := Start(ctx, Config{Name: "consoletest", Dir: dir, MemoryMiB: 512,
		Kernel: kernel, Initrd: initrd, Cmdline: "console=ttyS0 quiet"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Kill() })
	sock := v.ConsoleSocket()
	if len(sock) >= maxSocketPath || strings.HasPrefix(sock, dir) || filepath.Dir(sock) != filepath.Dir(v.qmpPath) {
		t.Errorf("console socket %s: want it beside QMP's (%s), outside the long VM directory", sock, v.qmpPath)
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Read all along, as a client must, until the test is done with it.
	received := make(chan []byte, 64)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(received)
		for {
			buf := make([]byte, 4096)
			n, err := conn.Read(buf)
			if n > 0 {
				select {
				case received <- buf[:n]:
				case <-done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// The first boot may have printed its marker before the client
	// connected; the boot after a reset prints it to the client.
	waitForBoots(t, v, 1, 90*time.Second)
	if err := v.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for !bytes.Contains(got, []byte(guestMarker)) || !bytes.Contains(got[bytes.Index(got, []byte(guestMarker)):], []byte("\n")) {
		select {
		case b, ok := <-received:
			if !ok {
				t.Fatalf("console socket closed before the boot marker; got:\n%s", tail(got, 2000))
			}
			got = append(got, b...)
		case <-ctx.Done():
			t.Fatalf("no boot marker on the console socket; got:\n%s", tail(got, 2000))
		}
	}
	waitForBoots(t, v, 2, 30*time.Second)
	if raw, _ := os.ReadFile(v.SerialLog()); !bytes.Contains(raw, got) {
		t.Errorf("the serial log lacks what the client read:\nclient:\n%s\nlog:\n%s", tail(got, 1000), tail(raw, 3000))
	}

	conn.Close()
	if err := v.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	waitForBoots(t, v, 3, 90*time.Second)

	if err := v.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{sock, filepath.Dir(sock)} {
		if exists(p) {
			t.Errorf("%s left behind after the VM ended", p)
		}
	}
}

// TestUEFIBoot starts a VM from a disk image with OVMF: the overlay, the
// variable store and the firmware's arguments must be right for OVMF to
// start and look for something to boot on the (empty) disk.
func TestUEFIBoot(t *testing.T) {
	tmp := t.TempDir()
	image := filepath.Join(tmp, "empty.img")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "vm1")
	t.Cleanup(func() { checkNoProcesses(t, dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	v, err := Start(ctx, Config{Name: "uefitest", Dir: dir, Image: image, MemoryMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Kill()
	out, err := exec.Command(QEMUImgBinary, "info", "--force-share", filepath.Join(dir, OverlayFile)).Output()
	if err != nil || !bytes.Contains(out, []byte("backing file: "+image)) {
		t.Errorf("overlay is not backed by the image: %v: %s", err, out)
	}
	// OVMF reports on the serial console that it found nothing to boot.
	deadline := time.Now().Add(45 * time.Second)
	for {
		raw, _ := os.ReadFile(v.SerialLog())
		if bytes.Contains(raw, []byte("BdsDxe")) {
			t.Logf("OVMF's boot manager ran after %v", time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no word from OVMF's boot manager on the serial console; log:\n%s", tail(raw, 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	vars, err := os.ReadFile(filepath.Join(dir, VarsFile))
	tmpl, _ := os.ReadFile(DefaultFirmware().Vars)
	if err != nil || len(vars) != len(tmpl) {
		t.Errorf("VM's variable store: %d bytes (%v), want a copy of the %d-byte template", len(vars), err, len(tmpl))
	}
}

// TestStartUndoes checks that a failed Start leaves no process behind and
// removes what it created, but keeps the logs that tell why it failed.
func TestStartUndoes(t *testing.T) {
	kernel := testKernel(t)
	notAKernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(notAKernel, []byte("not a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	provisionOK := func(rw io.ReadWriter) error { return nil }
	tests := map[string]struct {
		cfg     Config
		wantErr string
		// Files in Dir afterwards: present or absent.
		wantFiles, wantNoFiles []string
	}{
		"provisioning fails": {
			cfg: Config{
				Kernel:       kernel,
				StateDiskMiB: 16,
				ProvisionTPM: func(rw io.ReadWriter) error { return errors.New("no AK for you") },
			},
			wantErr:     "no AK for you",
			wantFiles:   []string{provisionLogFile},
			wantNoFiles: []string{StateFile, TPMDir, TPMDir + ".provision", QEMULogFile},
		},
		"QEMU fails after provisioning": {
			cfg: Config{
				Kernel:       notAKernel,
				StateDiskMiB: 16,
				ProvisionTPM: provisionOK,
			},
			wantErr:     "QEMU exited during start-up",
			wantFiles:   []string{QEMULogFile, provisionLogFile},
			wantNoFiles: []string{StateFile, filepath.Join(TPMDir, permanentStateFile), QMPSocket, SerialSocket},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Name = "undotest"
			cfg.Dir = filepath.Join(t.TempDir(), "vm")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			v, err := Start(ctx, cfg)
			if err == nil {
				v.Kill()
				t.Fatal("Start() succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Start() error = %v, want one containing %q", err, tc.wantErr)
			}
			t.Logf("Start() error: %v", err)
			checkNoProcesses(t, cfg.Dir)
			for _, f := range tc.wantFiles {
				if !exists(filepath.Join(cfg.Dir, f)) {
					t.Errorf("%s was removed", f)
				}
			}
			for _, f := range tc.wantNoFiles {
				if exists(filepath.Join(cfg.Dir, f)) {
					t.Errorf("%s was left behind", f)
				}
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	tests := map[string]struct {
		cfg     Config
		wantErr string
	}{
		"no name":            {cfg: Config{Dir: dir, Kernel: "/k"}, wantErr: "no name"},
		"no directory":       {cfg: Config{Name: "a", Kernel: "/k"}, wantErr: "no directory"},
		"nothing to boot":    {cfg: Config{Name: "a", Dir: dir}, wantErr: "neither an image nor a kernel"},
		"image and kernel":   {cfg: Config{Name: "a", Dir: dir, Image: "/i", Kernel: "/k"}, wantErr: "not both"},
		"negative memory":    {cfg: Config{Name: "a", Dir: dir, Kernel: "/k", MemoryMiB: -1}, wantErr: "negative"},
		"unknown accel":      {cfg: Config{Name: "a", Dir: dir, Kernel: "/k", Accel: "hvf"}, wantErr: "unknown accelerator"},
		"net without tap":    {cfg: Config{Name: "a", Dir: dir, Kernel: "/k", Net: &NetConfig{}}, wantErr: "without a tap"},
		"missing kernel":     {cfg: Config{Name: "a", Dir: dir, Kernel: filepath.Join(dir, "nope")}, wantErr: "kernel"},
		"missing firmware":   {cfg: Config{Name: "a", Dir: dir, Image: "/dev/null", Firmware: Firmware{Code: "/nope", Vars: "/nope"}}, wantErr: "ovmf"},
		"missing disk image": {cfg: Config{Name: "a", Dir: dir, Image: filepath.Join(dir, "nope")}, wantErr: "disk image"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v, err := Start(context.Background(), tc.cfg)
			if err == nil {
				v.Kill()
				t.Fatal("Start() succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Start() error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestQEMUArgs(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	tests := map[string]struct {
		cfg Config
		// want lists options with their values as they must appear.
		want    [][2]string
		notWant []string
	}{
		"kernel boot under TCG without network": {
			cfg: Config{Name: "n0", Dir: "/v", CPUs: 2, MemoryMiB: 512, Accel: AccelTCG, Kernel: "/k", Initrd: "/i", Cmdline: "console=ttyS0 a=b,c"},
			want: [][2]string{
				{"-accel", "tcg,thread=multi"}, {"-cpu", "max"}, {"-smp", "2"}, {"-m", "512"},
				{"-kernel", "/k"}, {"-initrd", "/i"}, {"-append", "console=ttyS0 a=b,c"},
				{"-nic", "none"},
				{"-chardev", "socket,id=serial0,server=on,wait=off,path=/s.sock,logfile=/v/serial.log"},
				{"-chardev", "socket,id=qmp,server=on,wait=off,path=/q.sock"},
				{"-chardev", "socket,id=chrtpm,path=/t.sock"},
				{"-device", "tpm-crb,tpmdev=tpm0"},
				{"-device", "virtio-rng-pci,rng=rng0"},
			},
			notWant: []string{"-netdev", "if=pflash", "virtio-blk-pci"},
		},
		"UEFI image under KVM with state disk and network": {
			cfg: Config{Name: "n1", Dir: "/v", CPUs: 4, MemoryMiB: 2048, Accel: AccelKVM, Image: "/img",
				Firmware: Firmware{Code: "/code.fd", Vars: "/vars.fd"}, StateDiskMiB: 100, Net: &NetConfig{Tap: "tap-n1", MAC: mac}},
			want: [][2]string{
				{"-accel", "kvm"}, {"-cpu", "host"},
				{"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=/code.fd"},
				{"-drive", "if=pflash,format=raw,unit=1,file=/v/efivars.fd"},
				{"-drive", "if=none,id=disk0,format=qcow2,file=/v/disk.qcow2"},
				{"-drive", "if=none,id=state,format=qcow2,file=/v/state.qcow2"},
				{"-device", "virtio-blk-pci,drive=state,serial=state"},
				{"-netdev", "tap,id=net0,ifname=tap-n1,script=no,downscript=no"},
				{"-device", "virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56"},
			},
			notWant: []string{"-kernel", "-nic"},
		},
		"commas in paths are escaped": {
			cfg: Config{Name: "a,b", Dir: "/v,1", Accel: AccelTCG, Image: "/img", Firmware: Firmware{Code: "/c,d.fd"}},
			want: [][2]string{
				{"-name", "a,,b"},
				{"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=/c,,d.fd"},
				{"-chardev", "socket,id=serial0,server=on,wait=off,path=/s.sock,logfile=/v,,1/serial.log"},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := qemuArgs(tc.cfg, "/t.sock", "/q.sock", "/s.sock")
			for _, w := range tc.want {
				found := false
				for i := 0; i+1 < len(args); i++ {
					if args[i] == w[0] && args[i+1] == w[1] {
						found = true
					}
				}
				if !found {
					t.Errorf("missing %s %s in %q", w[0], w[1], args)
				}
			}
			joined := strings.Join(args, " ")
			for _, nw := range tc.notWant {
				if strings.Contains(joined, nw) {
					t.Errorf("unexpected %s in %q", nw, args)
				}
			}
		})
	}
}

// TestProbe runs the KVM probe for real. Which accelerator it picks depends
// on the machine; it must decide quickly and say why when it falls back.
func TestProbe(t *testing.T) {
	kernel := testKernel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	accel, reason := Probe(ctx, kernel)
	took := time.Since(start)
	t.Logf("Probe() = %s (%s) in %v", accel, reason, took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("Probe took %v, want under 20s", took)
	}
	if accel != AccelKVM && accel != AccelTCG {
		t.Errorf("Probe() = %q, want kvm or tcg", accel)
	}
	if accel == AccelTCG && reason == "" {
		t.Error("Probe() fell back to TCG without a reason")
	}
}

// harnessEnv tells a re-executed test binary to play a harness that starts
// a VM in the directory it names and then waits to be killed.
const harnessEnv = "ORRERY_VMTEST_HARNESS_DIR"

// TestDiesWithHarness kills a harness process that runs a VM, as a crash or
// kill -9 would, and checks that the VM's QEMU and swtpm go with it.
func TestDiesWithHarness(t *testing.T) {
	if dir := os.Getenv(harnessEnv); dir != "" {
		runHarness(t, dir)
		return
	}
	kernel, initrd := testKernel(t), testInitrd(t)
	dir := filepath.Join(t.TempDir(), "vm2")
	cmd := exec.Command(os.Args[0], "-test.run=^TestDiesWithHarness$", "-test.v")
	// The harness dies without cleaning up: its temporary files (swtpm's
	// socket directory) go where the test removes them.
	cmd.Env = append(os.Environ(), harnessEnv+"="+dir, "ORRERY_VMTEST_KERNEL="+kernel, "ORRERY_VMTEST_INITRD="+initrd,
		"TMPDIR="+t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for len(processesIn(dir)) < 2 { // QEMU and swtpm
		if time.Now().After(deadline) {
			t.Fatalf("the harness did not start a VM; its output:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Let QEMU get going before pulling the rug.
	time.Sleep(500 * time.Millisecond)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	checkNoProcesses(t, dir)
}

func runHarness(t *testing.T, dir string) {
	v, err := Start(context.Background(), Config{
		Name:   "harnesstest",
		Dir:    dir,
		Kernel: os.Getenv("ORRERY_VMTEST_KERNEL"),
		Initrd: os.Getenv("ORRERY_VMTEST_INITRD"),
		// The kernel needs no console; nobody reads it.
		Cmdline: "quiet",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM running as PID %d; waiting to be killed", v.PID())
	time.Sleep(time.Minute)
	t.Fatal("the parent test did not kill this harness")
}

// TestKernelBootIgnoresFirmware checks that a kernel boot neither uses nor
// requires the UEFI firmware, which callers may pass along regardless.
func TestKernelBootIgnoresFirmware(t *testing.T) {
	cfg := Config{Name: "a", Dir: t.TempDir(), Kernel: testKernel(t), Firmware: Firmware{Code: "/nope", Vars: "/nope"}}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.Firmware != (Firmware{}) {
		t.Fatalf("firmware %+v kept for a kernel boot", cfg.Firmware)
	}
	for _, a := range qemuArgs(cfg, "/t.sock", "/q.sock", "/s.sock") {
		if strings.Contains(a, "pflash") {
			t.Fatalf("kernel boot with firmware argument %q", a)
		}
	}
}
