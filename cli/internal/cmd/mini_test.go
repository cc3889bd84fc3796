package cmd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/cloudtest"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
)

// TestMiniUpStatusDown drives the local cloud through the CLI as an owner
// would, with test guests instead of the OS image, in a network namespace.
func TestMiniUpStatusDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("orrery mini needs root: run as root (CI does)")
	}
	t.Setenv("ORRERY_CMD_TEST_AS_ORRERY", "1")
	kernel, initrd := cloudtest.Guest(t)
	dir := filepath.Join(t.TempDir(), "orrery-mini")
	ns := fmt.Sprintf("orrcli-%d", os.Getpid())
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Execute(context.Background(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	t.Cleanup(func() { cloud.Cleanup(context.Background(), dir) })

	up := []string{"mini", "up", "--mini-dir", dir, "--workers", "1", "--cpus", "1", "--memory", "256",
		"--state-disk-size", "64", "--kernel", kernel, "--initrd", initrd, "--cmdline", "console=ttyS0 panic=-1",
		"--netns", ns, "--shutdown-timeout", "500ms"}
	checkMiniUp(t, run, dir, up)

	// More memory than this machine has: the running cloud must be named
	// before what the new one would lack.
	code, _, errOut := run("mini", "up", "--mini-dir", dir, "--kernel", kernel, "--initrd", initrd, "--netns", ns, "--memory", "1000000")
	if code == 0 || !strings.Contains(errOut, "is running") {
		t.Errorf("second mini up: exit %d, stderr %q; want a refusal", code, errOut)
	}

	checkMiniStatus(t, run, dir)

	stopStart(t, run, dir, up)

	st, err := cloud.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkSessionPriority(t, st)
	checkMiniDown(t, run, dir, ns, st)

	// The logs left behind do not stand in the way of the next cloud.
	code, out, errOut := run(up...)
	if code != 0 || !strings.Contains(out, "The local cloud runs") {
		t.Fatalf("mini up after down: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if code, out, errOut = run("mini", "down", "--mini-dir", dir, "--yes"); code != 0 {
		t.Errorf("second mini down: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
}

// checkMiniUp brings the cloud in dir up with the arguments up and checks
// what it reports and writes.
func checkMiniUp(t *testing.T, run func(...string) (int, string, string), dir string, up []string) {
	t.Helper()
	code, out, errOut := run(up...)
	if code != 0 {
		t.Fatalf("mini up: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	t.Logf("mini up said:\n%s", out)
	for _, want := range []string{"The local cloud runs", "cp-0", "worker-0", "10.42.1.100", "10.42.2.100", "running"} {
		if !strings.Contains(out, want) {
			t.Errorf("mini up output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{cloud.PlatformCACert, cloud.InitSecretFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("mini up did not write %s: %v", f, err)
		}
	}
}

// checkMiniStatus checks 'mini status' of the running cloud in dir, in
// each output format.
func checkMiniStatus(t *testing.T, run func(...string) (int, string, string), dir string) {
	t.Helper()
	code, out, _ := run("mini", "status", "--mini-dir", dir)
	if code != 0 || strings.Count(out, "running") != 2 || !strings.Contains(out, "tcg") {
		t.Errorf("mini status: exit %d:\n%s", code, out)
	}
	checkYAMLMatchesJSON(t, func(args ...string) (string, string, int) {
		code, out, errOut := run(args...)
		return out, errOut, code
	}, []string{"mini", "status", "--mini-dir", dir}, "uptimeSeconds")
	if code, out, _ = run("mini", "status", "--mini-dir", dir, "-o", "jsonpath={.nodes[*].ip}"); code != 0 || strings.TrimSpace(out) != "10.42.1.100 10.42.2.100" {
		t.Errorf("mini status -o jsonpath: exit %d: %q", code, out)
	}
}

// checkMiniDown takes the cloud in dir, whose state was st, down: only
// with --yes, and then it leaves no process, namespace ns, nor anything
// but the logs and the platform CA behind.
func checkMiniDown(t *testing.T, run func(...string) (int, string, string), dir, ns string, st cloud.State) {
	t.Helper()
	// Without --yes and with no one to answer, nothing is deleted.
	code, out, errOut := run("mini", "down", "--mini-dir", dir)
	if code == 0 || !strings.Contains(errOut, "pass --yes") || !strings.Contains(out, "Delete the VMs cp-0, worker-0") {
		t.Fatalf("mini down without --yes: exit %d\nstdout: %s\nstderr: %s; want a question and a refusal", code, out, errOut)
	}
	if st, err := cloud.ReadState(dir); err != nil || !st.Live() {
		t.Fatalf("mini down without --yes took the cloud down: %v", err)
	}
	start := time.Now()
	code, out, errOut = run("mini", "down", "--mini-dir", dir, "--yes")
	if code != 0 || !strings.Contains(out, "is down") {
		t.Fatalf("mini down: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	t.Logf("mini down took %s", time.Since(start).Round(time.Millisecond))
	checkLeftAfterDown(t, dir, ns, st)
	code, out, _ = run("mini", "down", "--mini-dir", dir, "--yes")
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Errorf("second mini down: exit %d: %s", code, out)
	}
	code, _, errOut = run("mini", "status", "--mini-dir", dir)
	if code == 0 || !strings.Contains(errOut, "no local cloud") {
		t.Errorf("status after down: exit %d: %s", code, errOut)
	}
}

// checkLeftAfterDown checks what 'mini down' of the cloud in dir, whose
// state was st, left behind.
func checkLeftAfterDown(t *testing.T, dir, ns string, st cloud.State) {
	t.Helper()
	for _, n := range st.Nodes {
		if pids := cloud.ProcessesUsing(n.Dir); len(pids) > 0 {
			t.Errorf("processes %v of %s survive mini down", pids, n.Name)
		}
	}
	if nsList, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(nsList), ns) {
		t.Errorf("namespace %s survives mini down", ns)
	}
	if syscallAlive(st.SupervisorPID) {
		t.Errorf("supervisor %d survives mini down", st.SupervisorPID)
	}
	for _, n := range st.Nodes {
		entries, _ := os.ReadDir(n.Dir)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Contains(names, "serial.log") || slices.ContainsFunc(names, func(n string) bool { return filepath.Ext(n) != ".log" }) {
			t.Errorf("after mini down %s holds %v, want its logs only, serial.log among them", n.Dir, names)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, cloud.InitSecretFile)); err == nil {
		t.Errorf("mini down left the init secret")
	}
	if _, err := os.Stat(filepath.Join(dir, cloud.PlatformCACert)); err != nil {
		t.Errorf("mini down removed the platform CA: %v", err)
	}
}

// stopStart stops the running cloud in dir and starts it again: the VMs
// come back with the disks they marked before.
func stopStart(t *testing.T, run func(...string) (int, string, string), dir string, up []string) {
	t.Helper()
	before, err := cloud.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	marks := map[string]string{}
	for _, n := range before.Nodes {
		marks[n.Name] = waitGuestReport(t, n.SerialLog(), "disk", 1)
		if !strings.HasPrefix(marks[n.Name], "new ") {
			t.Fatalf("%s's first boot found its state disk %q, want a blank one", n.Name, marks[n.Name])
		}
	}
	if code, _, errOut := run("mini", "start", "--mini-dir", dir); code == 0 || !strings.Contains(errOut, "runs already") {
		t.Errorf("mini start of a running cloud: exit %d, %q; want a refusal", code, errOut)
	}

	code, out, errOut := run("mini", "stop", "--mini-dir", dir)
	if code != 0 || !strings.Contains(out, "is stopped") || !strings.Contains(out, "mini start") {
		t.Fatalf("mini stop: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	for _, n := range before.Nodes {
		if pids := cloud.ProcessesUsing(n.Dir); len(pids) > 0 {
			t.Errorf("processes %v of %s survive mini stop", pids, n.Name)
		}
	}
	if syscallAlive(before.SupervisorPID) {
		t.Errorf("supervisor %d survives mini stop", before.SupervisorPID)
	}
	if code, out, _ = run("mini", "status", "--mini-dir", dir); code != 0 || strings.Count(out, " stopped ") != 2 || !strings.Contains(out, "disks kept") {
		t.Errorf("mini status of a stopped cloud: exit %d:\n%s", code, out)
	}
	if code, out, _ = run("mini", "status", "--mini-dir", dir, "-o", "jsonpath={.phase}"); strings.TrimSpace(out) != cloud.PhaseStopped {
		t.Errorf("mini status -o jsonpath={.phase}: exit %d: %q", code, out)
	}
	if code, out, _ = run("mini", "stop", "--mini-dir", dir); code != 0 || !strings.Contains(out, "stopped already") {
		t.Errorf("second mini stop: exit %d: %s", code, out)
	}
	if code, _, errOut = run(up...); code == 0 || !strings.Contains(errOut, "stopped local cloud") {
		t.Errorf("mini up over a stopped cloud: exit %d, %q; want a refusal that names it", code, errOut)
	}

	code, out, errOut = run("mini", "start", "--mini-dir", dir)
	if code != 0 || !strings.Contains(out, "runs again") || !strings.Contains(out, "orrery recover --node 10.42.1.100") {
		t.Fatalf("mini start: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if code, out, _ = run("mini", "status", "--mini-dir", dir); code != 0 || strings.Count(out, "running") != 2 {
		t.Errorf("mini status after start: exit %d:\n%s", code, out)
	}
	for _, n := range before.Nodes {
		want := "kept " + strings.TrimPrefix(marks[n.Name], "new ")
		// The console goes on from the first boot's.
		if got := waitGuestReport(t, n.SerialLog(), "disk", 2); got != want {
			t.Errorf("%s after mini start: state disk %q, want %q (the disk it marked)", n.Name, got, want)
		}
	}
}

// waitGuestReport waits for the test guest's nth "ORRERY-GUEST key" line
// (from 1) in the serial log at path and returns its value.
func waitGuestReport(t *testing.T, path, key string, nth int) string {
	t.Helper()
	prefix := "ORRERY-GUEST " + key + " "
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		raw, _ := os.ReadFile(path)
		seen := 0
		for _, line := range strings.Split(string(raw), "\n") {
			if i := strings.Index(line, prefix); i >= 0 {
				if seen++; seen == nth {
					return strings.TrimSpace(line[i+len(prefix):])
				}
			}
		}
	}
	t.Fatalf("no %q in %s within 2 minutes", prefix, path)
	return ""
}

// checkSessionPriority checks that under TCG the supervisor's session
// weighs as much on the host's CPU as a process at the control plane's
// niceness, where the kernel groups the CPU by session.
func checkSessionPriority(t *testing.T, st cloud.State) {
	t.Helper()
	path := fmt.Sprintf("/proc/%d/autogroup", st.SupervisorPID)
	if _, err := os.Stat(path); os.IsNotExist(err) || st.Accel != vm.AccelTCG {
		t.Logf("no autogroup to check (%s, accelerator %s)", path, st.Accel)
		return
	}
	want := fmt.Sprintf(" nice %d", cloud.TCGControlPlaneNice)
	var got []byte
	// The supervisor raises it once its VMs run, just after 'mini up' sees them.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, _ = os.ReadFile(path); strings.Contains(string(got), want) {
			return
		}
	}
	t.Errorf("the supervisor's autogroup is %q, want %q", strings.TrimSpace(string(got)), want)
}

func syscallAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	// Signal 0 checks existence; a zombie still counts, so look at /proc.
	if p.Signal(syscall.Signal(0)) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !strings.Contains(string(stat), ") Z ")
}

// Root on a machine without sudo must get hints it can run as written.
func TestSudoPrefix(t *testing.T) {
	for _, c := range []struct {
		euid     int
		sudoUser string
		want     string
	}{
		{0, "", ""},
		{0, "alice", "sudo "},
		{1000, "", "sudo "},
	} {
		if got := sudoPrefix(c.euid, c.sudoUser); got != c.want {
			t.Errorf("sudoPrefix(%d, %q) = %q, want %q", c.euid, c.sudoUser, got, c.want)
		}
	}
}
