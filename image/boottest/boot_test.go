//go:build boottest

// Package boottest boots the built node image on the local cloud (OVMF +
// swtpm, TCG where KVM does not work) and checks it from outside. Run it
// with 'make boot-test' (image/boot-test.sh), as root.
package boottest

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/boottimeline"
)

var (
	imageDir = flag.String("image-dir", "build/image", "directory of the built image")
	orrery   = flag.String("orrery", "build/bin/orrery", "the orrery CLI")
	bootWait = flag.Duration("boot-timeout", 6*time.Minute, "how long the node may take to listen on port 9000")
)

const (
	namespace = "orrery-boottest"
	port      = 9000
	// waiting is what bootstrapperd prints once it serves init and join.
	waiting = "waiting for init or join"
)

func TestBoot(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the boot test needs root (network namespace, bridge, taps)")
	}
	image, _ := filepath.Abs(filepath.Join(*imageDir, "disk.qcow2"))
	want, err := measurements.Load(filepath.Join(*imageDir, "measurements.json"))
	if err != nil {
		t.Fatalf("%v: run 'make image' first", err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), *bootWait+5*time.Minute)
	defer cancel()

	powerOn := time.Now()
	c, err := cloud.Up(ctx, cloud.Spec{
		Dir: dir, ControlPlanes: 1, Image: image, StateDiskMiB: 2048,
		MemoryMiB: 2048, Namespace: namespace, KeepLogs: true, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatalf("bring up the cloud: %v", err)
	}
	node := c.Nodes()[0]
	boot := boottimeline.Follow(ctx, node.Name, node.SerialLog(), node.Started)
	defer func() {
		// After the checks, so that the steps after bootstrapperd's
		// (the images) are in too.
		for _, r := range boot.Rows() {
			t.Logf("TIMING %s", r)
		}
		if t.Failed() {
			serial, _ := os.ReadFile(node.SerialLog())
			t.Logf("serial console of %s:\n%s", node.Name, tail(serial, 150))
		}
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("cloud down: %v", err)
		}
	}()
	accel, why := c.Accel()
	t.Logf("node %s at %s, accelerator %s (%s)", node.Name, node.IP, accel, why)
	addr := netip.AddrPortFrom(node.IP, port).String()

	// bootstrapperd.socket accepts connections from the host.
	deadline := time.Now().Add(*bootWait)
	for {
		if err := inNamespace(ctx, "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", node.IP, port)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after %v", addr, *bootWait)
		}
		time.Sleep(time.Second)
	}
	t.Logf("TIMING power-on to port %d listening: %.1fs", port, time.Since(powerOn).Seconds())

	t.Run("PCRs on the console equal measurements.json", func(t *testing.T) { checkConsolePCRs(t, node.SerialLog(), want) })
	t.Run("orrery verify", func(t *testing.T) { checkOrreryVerify(ctx, t, addr, dir) })
	t.Run("bootstrapperd waits for init or join", func(t *testing.T) {
		if !waitFor(node.SerialLog(), waiting, time.Minute) {
			t.Errorf("the console never says %q", waiting)
		}
	})
	t.Run("state disk is LUKS2", func(t *testing.T) { checkStateDiskLUKS2(ctx, t, node.Dir) })
}

// checkConsolePCRs checks the PCRs the node's console (serialLog) shows
// against the image's measurements (want).
func checkConsolePCRs(t *testing.T, serialLog string, want measurements.M) {
	got := consolePCRs(t, serialLog, 2*time.Minute)
	for _, pcr := range []uint32{4, 5, 9, 11, 12, 13, 15} {
		if !bytes.Equal(got[pcr], want[pcr].Expected) {
			t.Errorf("PCR %d on the console is %x, measurements.json expects %x", pcr, got[pcr], want[pcr].Expected)
		}
	}
}

// checkOrreryVerify runs 'orrery verify' against the node at addr with
// the platform CA of the cloud in dir.
func checkOrreryVerify(ctx context.Context, t *testing.T, addr, dir string) {
	out, err := inNamespaceOutput(ctx, *orrery, "verify", "--node", addr,
		"--measurements", filepath.Join(*imageDir, "measurements.json"),
		"--platform-ca", filepath.Join(dir, "platform-ca.crt"))
	t.Logf("orrery verify:\n%s", out)
	if err != nil {
		t.Errorf("orrery verify: %v", err)
	}
}

// checkStateDiskLUKS2 checks that the state disk of the node in nodeDir
// starts with a LUKS2 header.
func checkStateDiskLUKS2(ctx context.Context, t *testing.T, nodeDir string) {
	out, err := exec.CommandContext(ctx, "qemu-io", "-U", "-r", "-f", "qcow2", "-c", "read -v 0 16",
		filepath.Join(nodeDir, "state.qcow2")).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	// "LUKS\xba\xbe" then the version, big-endian: 2.
	if !strings.Contains(string(out), "4c 55 4b 53 ba be 00 02") {
		t.Errorf("state disk does not start with a LUKS2 header:\n%s", out)
	}
}

// consolePCRs reads PCR values from the console: lines
// "PCR[11] sha256=<hex>" (orrery-pcrs.service). The last value of each
// PCR wins.
func consolePCRs(t *testing.T, path string, timeout time.Duration) map[uint32][]byte {
	re := regexp.MustCompile(`PCR\[(\d{1,2})\] sha256=([0-9a-f]{64})`)
	deadline := time.Now().Add(timeout)
	for {
		raw, _ := os.ReadFile(path)
		got := map[uint32][]byte{}
		for _, line := range strings.Split(string(raw), "\n") {
			m := re.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			n, _ := strconv.Atoi(m[1])
			v, _ := hex.DecodeString(strings.ToLower(m[2]))
			got[uint32(n)] = v
		}
		if len(got[11]) > 0 || time.Now().After(deadline) {
			return got
		}
		time.Sleep(2 * time.Second)
	}
}

// onConsole runs command in the root shell on node's serial console and
// returns its output, which it logs; the exit status must be 0.
func onConsole(ctx context.Context, t *testing.T, node *cloud.Node, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, code, err := node.RunOnConsole(ctx, command)
	if err != nil {
		t.Fatalf("%s on the console: %v\noutput so far:\n%s", command, err, out)
	}
	t.Logf("%s on the console (exit status %d, %.1fs):\n%s", command, code, time.Since(start).Seconds(), out)
	if code != 0 {
		t.Errorf("%s on the console: exit status %d", command, code)
	}
	return out
}

func waitFor(path, text string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if raw, _ := os.ReadFile(path); bytes.Contains(raw, []byte(text)) {
			return true
		}
		time.Sleep(time.Second)
	}
	return false
}

func inNamespace(ctx context.Context, args ...string) error {
	_, err := inNamespaceOutput(ctx, args...)
	return err
}

func inNamespaceOutput(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", namespace}, args...)...).CombinedOutput()
}

func tail(b []byte, lines int) string {
	l := strings.Split(string(b), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestTamperedRootStops boots a copy of the image whose root partition has
// one byte changed (in the erofs superblock, which every boot reads): dm-verity
// must refuse it, the console must say why, and the node must power off
// without ever starting bootstrapperd.
func TestTamperedRootStops(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the boot test needs root (network namespace, bridge, taps)")
	}
	dir := t.TempDir()
	tampered := filepath.Join(dir, "tampered.raw")
	if out, err := exec.Command("cp", "--sparse=always", filepath.Join(*imageDir, "disk.raw"), tampered).CombinedOutput(); err != nil {
		t.Fatalf("copy image: %v: %s", err, out)
	}
	offset := rootPartitionOffset(t, tampered)
	f, err := os.OpenFile(tampered, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	f.ReadAt(b[:], offset+1100)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b[:], offset+1100); err != nil {
		t.Fatal(err)
	}
	f.Close()

	ctx, cancel := context.WithTimeout(context.Background(), *bootWait)
	defer cancel()
	c, err := cloud.Up(ctx, cloud.Spec{
		Dir: filepath.Join(dir, "cloud"), ControlPlanes: 1, Image: tampered, StateDiskMiB: 256,
		MemoryMiB: 1024, Namespace: namespace, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatalf("bring up the cloud: %v", err)
	}
	defer c.Down(context.Background())
	node := c.Nodes()[0]
	select {
	case <-node.VM().Exited():
	case <-ctx.Done():
		serial, _ := os.ReadFile(node.SerialLog())
		t.Fatalf("the node with a tampered root did not power off; console:\n%s", tail(serial, 60))
	}
	serial, _ := os.ReadFile(node.SerialLog())
	if !bytes.Contains(serial, []byte("dm-verity: root filesystem does not match the measured root hash")) {
		t.Errorf("the console does not say the root failed dm-verity:\n%s", tail(serial, 60))
	}
	if bytes.Contains(serial, []byte("bootstrapperd")) {
		t.Error("bootstrapperd started from a tampered root")
	}
	for _, line := range strings.Split(string(serial), "\n") {
		if strings.Contains(line, "orrery-init: root") || strings.Contains(line, "failure:") {
			t.Logf("console: %s", strings.TrimSpace(line))
		}
	}
}

// rootPartitionOffset finds the orrery-root partition with sfdisk.
func rootPartitionOffset(t *testing.T, disk string) int64 {
	out, err := exec.Command("sfdisk", "--json", disk).Output()
	if err != nil {
		t.Fatalf("sfdisk: %v", err)
	}
	var table struct {
		PartitionTable struct {
			SectorSize int64 `json:"sectorsize"`
			Partitions []struct {
				Start int64  `json:"start"`
				Name  string `json:"name"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &table); err != nil {
		t.Fatal(err)
	}
	ss := table.PartitionTable.SectorSize
	if ss == 0 {
		ss = 512
	}
	for _, p := range table.PartitionTable.Partitions {
		if p.Name == "orrery-root" {
			return p.Start * ss
		}
	}
	t.Fatalf("no orrery-root partition in %s", disk)
	return 0
}

var debugImageDir = flag.String("debug-image-dir", "", "directory of the debug image ('make image DEBUG=1'); empty skips TestDebugImage")

// TestDebugImage boots the debug variant: its console logs root in
// automatically, and an operator there sees bootstrapperd's state with
// systemctl and journalctl; its own measurements pass, and the production
// measurements refuse it, so a debug node can never join a production
// cluster.
func TestDebugImage(t *testing.T) {
	if *debugImageDir == "" {
		t.Skip("no -debug-image-dir given (build it with 'make image DEBUG=1')")
	}
	if os.Getuid() != 0 {
		t.Skip("the boot test needs root (network namespace, bridge, taps)")
	}
	image, _ := filepath.Abs(filepath.Join(*debugImageDir, "disk.qcow2"))
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), *bootWait+5*time.Minute)
	defer cancel()
	c, err := cloud.Up(ctx, cloud.Spec{Dir: dir, ControlPlanes: 1, Image: image, StateDiskMiB: 1024,
		MemoryMiB: 2048, Namespace: namespace, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Down(context.Background())
	node := c.Nodes()[0]
	addr := netip.AddrPortFrom(node.IP, port).String()
	deadline := time.Now().Add(*bootWait)
	for !waitFor(node.SerialLog(), waiting, 2*time.Second) {
		select {
		case <-node.VM().Exited():
		default:
			if time.Now().Before(deadline) {
				continue
			}
		}
		serial, _ := os.ReadFile(node.SerialLog())
		t.Fatalf("the debug node never waits for init or join:\n%s", tail(serial, 80))
	}
	if !waitFor(node.SerialLog(), "root@", 2*time.Minute) {
		serial, _ := os.ReadFile(node.SerialLog())
		t.Errorf("no automatic root login on the debug console:\n%s", tail(serial, 40))
	}
	t.Run("bootstrapperd seen from the console", func(t *testing.T) {
		status := onConsole(ctx, t, node, "systemctl status bootstrapperd --no-pager")
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^\s*Active: active \(running\)`),
			// A Type=notify unit shows the daemon's STATUS=.
			regexp.MustCompile(`(?m)^\s*Status: "` + regexp.QuoteMeta(waiting) + `"`),
		} {
			if !want.MatchString(status) {
				t.Errorf("systemctl status shows no line matching %s", want)
			}
		}
		journal := onConsole(ctx, t, node, "journalctl -u bootstrapperd --no-pager")
		// bootstrapperd's own line (not systemd's) once it serves.
		startup := regexp.MustCompile(`(?m)bootstrapperd\[\d+\]: .*` + regexp.QuoteMeta(waiting))
		if !startup.MatchString(journal) {
			t.Errorf("the journal has no line of bootstrapperd matching %s", startup)
		}
		// Operators filter by phase: every slog attribute is a journal field.
		fields := onConsole(ctx, t, node, "journalctl -u bootstrapperd PHASE=wait -o verbose --no-pager")
		for _, want := range []string{"MESSAGE=" + waiting, "PHASE=wait", "SYSLOG_IDENTIFIER=bootstrapperd", "LISTEN="} {
			if !strings.Contains(fields, want) {
				t.Errorf("journalctl PHASE=wait -o verbose has no %q:\n%s", want, fields)
			}
		}
	})
	verify := func(measurementsDir string) ([]byte, error) {
		return inNamespaceOutput(ctx, *orrery, "verify", "--node", addr, "--timeout", "2m",
			"--measurements", filepath.Join(measurementsDir, "measurements.json"),
			"--platform-ca", filepath.Join(dir, "platform-ca.crt"))
	}
	if out, err := verify(*debugImageDir); err != nil {
		t.Errorf("debug node against its own measurements: %v\n%s", err, out)
	}
	out, err := verify(*imageDir)
	if err == nil || !bytes.Contains(out, []byte("mismatch")) {
		t.Errorf("debug node against production measurements: err %v, want a PCR mismatch\n%s", err, out)
	}
	t.Logf("production measurements refuse the debug node:\n%s", out)
}
