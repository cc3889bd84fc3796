package cloud_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/cloudtest"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/role"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the local cloud creates network namespaces, bridges and taps: run as root (CI does)")
	}
}

func testSpec(t testing.TB, dir string, cps, workers int) cloud.Spec {
	kernel, initrd := cloudtest.Guest(t)
	return cloud.Spec{
		Dir:           dir,
		ControlPlanes: cps,
		Workers:       workers,
		CPUs:          1,
		MemoryMiB:     256,
		Kernel:        kernel,
		Initrd:        initrd,
		Cmdline:       "console=ttyS0 panic=-1 quiet",
		Namespace:     fmt.Sprintf("orrtest-%d-%d", os.Getpid(), time.Now().UnixNano()%100000),
		Bridge:        "orrtest0",
		Progress:      testWriter{t},
		// The test guest ignores the ACPI power button.
		ShutdownTimeout: 500 * time.Millisecond,
		// The test guest serves its name there.
		LoadBalancerPorts: []uint16{8080},
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// guestReports reads the "ORRERY-GUEST key value" lines of a serial log.
func guestReports(path string) map[string][]string {
	out := map[string][]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, "ORRERY-GUEST ")
		if i < 0 {
			continue
		}
		key, value, _ := strings.Cut(line[i+len("ORRERY-GUEST "):], " ")
		out[key] = append(out[key], strings.TrimSpace(value))
	}
	return out
}

func waitReport(t *testing.T, ctx context.Context, n *cloud.Node, key string, count int) []string {
	t.Helper()
	for {
		r := guestReports(n.SerialLog())
		if e := r["error"]; len(e) > 0 {
			t.Fatalf("%s reports an error: %v", n.Name, e)
		}
		if len(r[key]) >= count {
			return r[key]
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(n.SerialLog())
			t.Fatalf("%s: no %d×%q report in time; serial log:\n%s", n.Name, count, key, log)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestTwoVMs boots two guests on the cloud's network and checks what a
// node relies on: DHCP, the metadata API, reaching its peer, a vTPM with a
// platform-certified AK, and QMP control; then that Down leaves nothing.
func TestTwoVMs(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	spec := testSpec(t, dir, 1, 1)
	c, err := cloud.Up(ctx, spec)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	downed := false
	defer func() {
		if !downed {
			c.Down(context.Background())
		}
	}()

	// A second Up from the same directory is refused while this one runs.
	if _, err := cloud.Up(ctx, spec); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second Up: err = %v, want 'already running'", err)
	}

	ca, err := platformca.LoadCert(filepath.Join(dir, cloud.PlatformCACert))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	nodes := c.Nodes()
	for _, n := range nodes {
		waitReport(t, ctx, n, "ready", 1)
		r := guestReports(n.SerialLog())
		if got := r["ip"][0]; got != n.IP.String() {
			t.Errorf("%s: DHCP gave %s, want %s", n.Name, got, n.IP)
		}
		if got, want := r["self"][0], fmt.Sprintf("%s %s %s", n.Name, n.Role, n.IP); got != want {
			t.Errorf("%s: metadata self = %q, want %q", n.Name, got, want)
		}
		if got := r["peers"][0]; got != "cp-0,worker-0" {
			t.Errorf("%s: metadata peers = %q, want cp-0,worker-0", n.Name, got)
		}
		other := nodes[0].Name
		if n == nodes[0] {
			other = nodes[1].Name
		}
		if got := r["reached"]; len(got) != 1 || got[0] != other {
			t.Errorf("%s: reached %v, want [%s]", n.Name, got, other)
		}
		tpm := r["tpm"][0]
		der, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(tpm, "akcert:"))
		if !strings.HasPrefix(tpm, "akcert:") || err != nil {
			t.Fatalf("%s: TPM report %q, want an AK certificate", n.Name, tpm)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("%s: AK certificate does not verify against the platform CA: %v", n.Name, err)
		}
	}

	assertBalancesToControlPlane(t, ctx, c)

	// A hard reset through QMP reboots the guest.
	if err := nodes[1].VM().Reset(ctx); err != nil {
		t.Fatalf("reset: %v", err)
	}
	waitReport(t, ctx, nodes[1], "boot", 2)
	waitReport(t, ctx, nodes[1], "ready", 2)

	st, err := cloud.ReadState(dir)
	if err != nil || len(st.Nodes) != 2 {
		t.Fatalf("state file: %+v, %v", st, err)
	}
	if err := c.Down(ctx); err != nil {
		t.Fatalf("Down: %v", err)
	}
	downed = true
	assertNothingLeft(t, spec, st)
}

// assertBalancesToControlPlane: the load balancer reaches the control
// plane, and only it.
func assertBalancesToControlPlane(t *testing.T, ctx context.Context, c *cloud.Cloud) {
	t.Helper()
	for range 3 {
		if got := throughLoadBalancer(t, ctx, c); got != "cp-0" {
			t.Errorf("the load balancer reached %q, want cp-0, the only control plane", got)
		}
	}
}

// throughLoadBalancer asks for a name at the cloud's load balancer, from
// inside the cloud's network; its health checks may take a few seconds to
// pass first.
func throughLoadBalancer(t *testing.T, ctx context.Context, c *cloud.Cloud) string {
	t.Helper()
	var got string
	addr := net.JoinHostPort(cloud.LoadBalancerIP.String(), "8080")
	var last error
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		// Dialled inside the namespace; the connection works from anywhere.
		last = c.Network().Do(func() error {
			conn, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			got = string(b)
			return err
		})
		if last == nil {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("through the load balancer: %v (%v)", last, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	t.Fatalf("through the load balancer: %v", last)
	return ""
}

func assertNothingLeft(t *testing.T, spec cloud.Spec, st cloud.State) {
	t.Helper()
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), spec.Namespace) {
		t.Errorf("namespace %s is left: %s", spec.Namespace, out)
	}
	for _, n := range st.Nodes {
		if _, err := os.Stat(n.Dir); err == nil {
			t.Errorf("VM directory %s is left", n.Dir)
		}
		if pids := cloud.ProcessesUsing(n.Dir); len(pids) > 0 {
			t.Errorf("processes %v of %s are left", pids, n.Name)
		}
	}
	if pids := cloud.ProcessesUsing(filepath.Join(spec.Dir, cloud.LoadBalancerDir)); len(pids) > 0 {
		t.Errorf("load balancer processes %v are left", pids)
	}
	for _, f := range []string{cloud.StateFile, cloud.LockFile, cloud.InitSecretFile, cloud.LoadBalancerDir} {
		if _, err := os.Stat(filepath.Join(spec.Dir, f)); err == nil {
			t.Errorf("%s is left", f)
		}
	}
}

// TestCleanupAfterCrash simulates a supervisor that died without Down: the
// state file is all that is left to find the leftovers by.
func TestCleanupAfterCrash(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	spec := testSpec(t, dir, 1, 0)
	c, err := cloud.Up(ctx, spec)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	st, err := cloud.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	c.Abandon() // the supervisor "crashes": its services stop, its VMs and network stay
	if pids := cloud.ProcessesUsing(st.Nodes[0].Dir); len(pids) == 0 {
		t.Fatal("VM processes should still run after the crash")
	}
	if err := cloud.Cleanup(ctx, dir); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	assertNothingLeft(t, spec, st)
}

// BenchmarkUpToLeases measures the time from Up to every VM holding its
// DHCP lease, for 3 small VMs.
func BenchmarkUpToLeases(b *testing.B) {
	requireRoot(b)
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		spec := testSpec(b, b.TempDir(), 1, 2)
		spec.Progress = nil
		start := time.Now()
		c, err := cloud.Up(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.WaitLeases(ctx); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s-to-leases")
		b.StopTimer()
		c.Down(context.Background())
		cancel()
		b.StartTimer()
	}
}

// TestFailedUpRemovesEverything makes the second VM fail to start, after
// the network and the first VM exist, and checks Up leaves nothing behind.
func TestFailedUpRemovesEverything(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	spec := testSpec(t, dir, 1, 1)
	// The worker's directory is a file: its VM cannot be created.
	if err := os.WriteFile(filepath.Join(dir, "worker-0"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := cloud.Up(ctx, spec)
	if err == nil {
		c.Down(context.Background())
		t.Fatal("Up succeeded although a VM could not start")
	}
	t.Logf("Up failed as intended: %v", err)
	os.Remove(filepath.Join(dir, "worker-0"))
	assertNothingLeft(t, spec, cloud.State{Nodes: []*cloud.Node{{Name: "cp-0", Dir: filepath.Join(dir, "cp-0")}}})
}

// TestCancelledUpRemovesEverything cancels Up while it starts VMs.
func TestCancelledUpRemovesEverything(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	spec := testSpec(t, dir, 1, 2)
	ctx, cancel := context.WithCancel(context.Background())
	spec.Progress = cancelOn{t: t, substr: "vm worker-0", cancel: cancel}
	c, err := cloud.Up(ctx, spec)
	if err == nil {
		c.Down(context.Background())
		t.Fatal("Up succeeded although its context was cancelled")
	}
	assertNothingLeft(t, spec, cloud.State{Nodes: []*cloud.Node{
		{Name: "cp-0", Dir: filepath.Join(dir, "cp-0")},
		{Name: "worker-0", Dir: filepath.Join(dir, "worker-0")},
	}})
}

// cancelOn cancels a context when a progress line mentions substr.
type cancelOn struct {
	t      testing.TB
	substr string
	cancel func()
}

func (c cancelOn) Write(p []byte) (int, error) {
	c.t.Log(strings.TrimRight(string(p), "\n"))
	if strings.Contains(string(p), c.substr) {
		c.cancel()
	}
	return len(p), nil
}

// A VM whose command line names no image flavour (a cloud image's)
// refuses the simulated SEV-SNP that the cloud's metadata offers it; the
// same VM on a plain cloud attests with its vTPM. Both are the node's own
// detection (nodeattest.Detect) over this kernel's /proc/cpuinfo and sysfs
// and the cloud's metadata service.
func TestCloudFlavourRefusesTheSimulation(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, tt := range []struct {
		sevSNP bool
		want   []string
	}{
		{sevSNP: true, want: []string{"error: refusing to attest", "simulated SEV-SNP", "cloud flavour"}},
		{sevSNP: false, want: []string{"qemu-vtpm"}},
	} {
		spec := testSpec(t, t.TempDir(), 1, 0)
		spec.SEVSNP = tt.sevSNP
		c, err := cloud.Up(ctx, spec)
		if err != nil {
			t.Fatalf("Up: %v", err)
		}
		got := waitReport(t, ctx, c.Nodes()[0], "attest", 1)[0]
		c.Down(context.Background())
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("SEV-SNP %v: the guest's attestation %q lacks %q", tt.sevSNP, got, w)
			}
		}
	}
}

// TestSpareStartsLater checks that a spare slot is addressed and known to
// the metadata service from the start but boots only on StartSpare.
func TestSpareStartsLater(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	spec := testSpec(t, dir, 1, 0)
	spec.Spares = 1
	c, err := cloud.Up(ctx, spec)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	defer c.Down(context.Background())
	if err := c.WaitLeases(ctx); err != nil {
		t.Fatalf("the started node's lease: %v", err)
	}
	cp, spare := c.Nodes()[0], c.Nodes()[1]
	if !spare.Spare || spare.VM() != nil || spare.Name != "spare-0" || spare.Role != role.Worker {
		t.Fatalf("spare slot %+v: want an unstarted worker named spare-0", spare)
	}
	if got := waitReport(t, ctx, cp, "peers", 1); got[0] != "cp-0,spare-0" {
		t.Fatalf("metadata peers = %q, want the spare listed", got[0])
	}

	n, err := c.StartSpare(ctx, cloud.SpareOptions{})
	if err != nil {
		t.Fatalf("StartSpare: %v", err)
	}
	// Under TCG the control plane runs above the host's other work and a
	// worker yields to it. Niceness adds up: the test itself may run niced.
	base := niceness(t, os.Getpid())
	wantCP, wantWorker := base, base
	if accel, _ := c.Accel(); accel == vm.AccelTCG {
		wantCP = max(base+cloud.TCGControlPlaneNice, -20)
		wantWorker = min(base+cloud.TCGWorkerNice, 19)
	}
	if got := niceness(t, n.PID); got != wantWorker {
		t.Errorf("the spare's QEMU runs at niceness %d, want %d", got, wantWorker)
	}
	if got := niceness(t, cp.PID); got != wantCP {
		t.Errorf("the control plane's QEMU runs at niceness %d, want %d", got, wantCP)
	}
	if n != spare || n.VM() == nil || n.Spare {
		t.Fatalf("StartSpare started %+v", n)
	}
	// Each reaches the other: the spare got its reserved address.
	if got := waitReport(t, ctx, cp, "reached", 1); got[0] != "spare-0" {
		t.Fatalf("cp-0 reached %v", got)
	}
	if got := waitReport(t, ctx, n, "ready", 1); got[0] != "spare-0" {
		t.Fatalf("spare reports %v", got)
	}
	if r := guestReports(n.SerialLog()); r["ip"][0] != n.IP.String() {
		t.Fatalf("spare got %v from DHCP, want %s", r["ip"], n.IP)
	}
	if _, err := c.StartSpare(ctx, cloud.SpareOptions{}); err == nil || !strings.Contains(err.Error(), "no spare slot left") {
		t.Fatalf("second StartSpare: %v, want 'no spare slot left'", err)
	}
	st, _ := cloud.ReadState(dir)
	if err := c.Down(ctx); err != nil {
		t.Fatalf("Down: %v", err)
	}
	assertNothingLeft(t, spec, st)
}

// niceness is the CPU niceness of process pid.
func niceness(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("read the niceness of %d: %v", pid, err)
	}
	// The command name (field 2) may hold spaces; count from its end.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	n, err := strconv.Atoi(fields[16])
	if err != nil {
		t.Fatalf("niceness of %d in %q: %v", pid, stat, err)
	}
	return n
}

// TestStopStartKeepsDisks stops a cloud and starts it again: the VM
// boots with the disk it wrote to and the vTPM it was certified in, and
// a new cloud is not made over the stopped one.
func TestStopStartKeepsDisks(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, spec, disk := upMarkedNode(t, ctx, dir)
	defer c.Down(context.Background())
	n := c.Nodes()[0]
	ak := guestReports(n.SerialLog())["tpm"][0]
	if !strings.HasPrefix(ak, "akcert:") {
		t.Fatalf("first boot: tpm %.40q; want an AK certificate", ak)
	}
	secret, err := os.ReadFile(filepath.Join(dir, cloud.InitSecretFile))
	if err != nil {
		t.Fatal(err)
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if pids := cloud.ProcessesUsing(n.Dir); len(pids) > 0 {
		t.Fatalf("processes %v of %s run after Stop", pids, n.Name)
	}
	st, err := cloud.ReadState(dir)
	if err != nil || st.Phase != cloud.PhaseStopped || st.SupervisorPID != 0 || st.Stopped.IsZero() {
		t.Fatalf("state after Stop: phase %q, supervisor %d, stopped %s, %v; want stopped, no supervisor", st.Phase, st.SupervisorPID, st.Stopped, err)
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), spec.Namespace) {
		t.Errorf("the network namespace outlives Stop: %s", out)
	}
	for _, f := range []string{vm.StateFile, vm.TPMDir} {
		if _, err := os.Stat(filepath.Join(n.Dir, f)); err != nil {
			t.Errorf("Stop removed %s: %v", f, err)
		}
	}
	other := spec
	other.Dir = dir
	if _, err := cloud.Up(ctx, other); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("Up over a cloud this process holds: %v; want a refusal", err)
	}

	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	// The console continues the first boot's.
	waitReport(t, ctx, n, "ready", 2)
	second := guestReports(n.SerialLog())
	if second["disk"][0] != disk {
		t.Errorf("after Start the console lost the first boot: disk reports %v", second["disk"])
	}
	if got, want := second["disk"][1], "kept "+strings.TrimPrefix(disk, "new "); got != want {
		t.Errorf("after Start the disk reports %q, want %q", got, want)
	}
	if second["tpm"][1] != ak {
		t.Errorf("after Start the vTPM holds another AK certificate: the vTPM was not kept")
	}
	if again, _ := os.ReadFile(filepath.Join(dir, cloud.InitSecretFile)); string(again) != string(secret) {
		t.Errorf("Start changed the init secret")
	}
	if err := c.Start(ctx); err == nil {
		t.Errorf("Start of a running cloud succeeded")
	}
}

// TestStopAfterCrashThenResume stops a cloud whose supervisor died, as
// 'orrery mini stop' does, and resumes it from its state file alone.
func TestStopAfterCrashThenResume(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, spec, disk := upMarkedNode(t, ctx, dir)
	n := c.Nodes()[0]
	c.Abandon()
	defer cloud.Cleanup(context.Background(), dir)

	if _, err := cloud.Resume(ctx, dir, testWriter{t}); err == nil || !strings.Contains(err.Error(), "runs already") {
		t.Fatalf("Resume of a running cloud: %v; want a refusal", err)
	}
	already, err := cloud.StopDir(ctx, dir)
	if err != nil || already {
		t.Fatalf("StopDir after the crash: already %v, %v", already, err)
	}
	if pids := cloud.ProcessesUsing(n.Dir); len(pids) > 0 {
		t.Fatalf("processes %v of %s run after StopDir", pids, n.Name)
	}
	if already, err := cloud.StopDir(ctx, dir); err != nil || !already {
		t.Errorf("second StopDir: already %v, %v; want stopped already", already, err)
	}
	// No process holds the directory now: only the state file stands
	// between a new cloud and the stopped one's disks.
	if _, err := cloud.Up(ctx, spec); err == nil || !strings.Contains(err.Error(), "stopped local cloud") {
		t.Fatalf("Up over the stopped cloud: %v; want a refusal that names it", err)
	}
	for _, f := range []string{vm.StateFile, vm.TPMDir} {
		if _, err := os.Stat(filepath.Join(n.Dir, f)); err != nil {
			t.Fatalf("the refused Up removed %s: %v", f, err)
		}
	}

	r, err := cloud.Resume(ctx, dir, testWriter{t})
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	defer r.Down(context.Background())
	rn := r.Nodes()[0]
	if rn.Name != n.Name || rn.IP != n.IP || rn.MAC != n.MAC {
		t.Errorf("resumed node %s %s %s, want %s %s %s", rn.Name, rn.IP, rn.MAC, n.Name, n.IP, n.MAC)
	}
	waitReport(t, ctx, rn, "ready", 2)
	if got, want := guestReports(rn.SerialLog())["disk"][1], "kept "+strings.TrimPrefix(disk, "new "); got != want {
		t.Errorf("after Resume the disk reports %q, want %q", got, want)
	}
	if got := guestReports(rn.SerialLog())["ip"][1]; got != n.IP.String() {
		t.Errorf("after Resume DHCP gave %s, want %s", got, n.IP)
	}
}

// upMarkedNode brings up a cloud of one node with a state disk in dir and
// waits for its first boot, which marks the blank disk; it returns the
// cloud, its spec and the guest's "disk new ID" report.
func upMarkedNode(t *testing.T, ctx context.Context, dir string) (*cloud.Cloud, cloud.Spec, string) {
	t.Helper()
	spec := testSpec(t, dir, 1, 0)
	spec.StateDiskMiB = 16
	c, err := cloud.Up(ctx, spec)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	n := c.Nodes()[0]
	waitReport(t, ctx, n, "ready", 1)
	disk := guestReports(n.SerialLog())["disk"][0]
	if !strings.HasPrefix(disk, "new ") {
		c.Down(context.Background())
		t.Fatalf("first boot: disk %q; want a blank disk, marked", disk)
	}
	return c, spec, disk
}
