//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
)

func TestInitSteps(t *testing.T) {
	out := "Initialising\n  [   0.9s] node locked\nTime per step:\n    node locked to the new cluster  0s\n" +
		"    orrery-images                   2m8.5s\n    kubeadm wait-control-plane      41.2s\nDone in 4m2s. Kubeconfig: x\n"
	got := initSteps(out)
	want := []phase{{"  init: node locked to the new cluster", 0}, {"  init: orrery-images", 128500 * time.Millisecond},
		{"  init: kubeadm wait-control-plane", 41200 * time.Millisecond}}
	if len(got) != len(want) {
		t.Fatalf("initSteps = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d = %v, want %v", i, got[i], want[i])
		}
	}
	if initSteps("no table here") != nil {
		t.Error("rows from an output without a table")
	}
}

// A wait ends before go test's deadline, with the teardown's time left.
func TestWaitDeadline(t *testing.T) {
	end, ok := t.Deadline()
	if !ok {
		t.Skip("go test -timeout 0: no deadline")
	}
	if got := waitDeadline(t, 1000*time.Hour); !got.Equal(end.Add(-teardown)) {
		t.Errorf("waitDeadline(1000h) = %s, want go test's deadline less %s (%s)", got, teardown, end.Add(-teardown))
	}
	if end.Add(-teardown).Before(time.Now().Add(time.Minute)) {
		t.Skip("less than the teardown and a minute left")
	}
	before := time.Now()
	if got := waitDeadline(t, time.Second); got.Before(before.Add(time.Second)) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("waitDeadline(1s) = %s, want a second from now (%s)", got, before.Add(time.Second))
	}
}

func TestPatience(t *testing.T) {
	defer func(old float64) { *slowdown = old }(*slowdown)
	for _, c := range []struct {
		slowdown float64
		want     time.Duration
	}{
		{1, 10 * time.Minute},
		{2, 20 * time.Minute},
		{1.5, 15 * time.Minute},
		// Less than 1 would cut the waits that an idle host needs.
		{0.5, 10 * time.Minute},
		{0, 10 * time.Minute},
	} {
		*slowdown = c.slowdown
		if got := patience(10 * time.Minute); got != c.want {
			t.Errorf("-slowdown %v: patience(10m) = %s, want %s", c.slowdown, got, c.want)
		}
	}
}

// TestFailureSummary: a failed run's last lines name the phase and show
// Orrery's own console lines, not the kernel's, and no spare that never
// booted.
func TestFailureSummary(t *testing.T) {
	dir := t.TempDir()
	worker := &cloud.Node{Name: "worker-0", Dir: filepath.Join(dir, "worker-0")}
	spare := &cloud.Node{Name: "spare-0", Dir: filepath.Join(dir, "spare-0")}
	if err := os.MkdirAll(worker.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	console := "[    1.0] Linux version 6.1\r\norrery-init: state: state disk is /dev/vdb [+2.296s]\r\n" +
		"[  166.1] bootstrapperd[265]: no join ticket yet; retrying reason=\"PermissionDenied\"\x1b[0m\r\n[ 1113.4] reboot: Power down\r\n"
	if err := os.WriteFile(worker.SerialLog(), []byte(console), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &phases{rows: []phase{{name: "a second init is refused"}}}
	failure := "orrery verify of the running cluster: exit status 1\n" + strings.Repeat("worker-0: OK\n", 20) + "1 of 2 nodes did not pass"
	got := failureSummary(p.failed(), failure, []*cloud.Node{worker, spare}, dir)
	// CI shows the end: the error comes last, its first line kept.
	if _, end, _ := strings.Cut(got, "state disk is /dev/vdb"); !strings.Contains(end, "orrery verify of the running cluster: exit status 1\n    … 11 lines …\n") ||
		!strings.HasSuffix(end, "worker-0: OK\n1 of 2 nodes did not pass\n") || strings.Count(end, "worker-0: OK") != 9 {
		t.Errorf("summary does not end with the error's first line and its last ones:\n%s", got)
	}
	if got := failureSummary(p.failed(), "", nil, dir); !strings.HasSuffix(got, "(its errors are above, where it ran)\n") {
		t.Errorf("summary without a recorded error: %q", got)
	}
	for _, want := range []string{
		`e2e: FAILED in phase: the one after "a second init is refused"`,
		"orrery-init: state: state disk is /dev/vdb",
		`bootstrapperd[265]: no join ticket yet; retrying reason="PermissionDenied"[0m`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"Linux version", "Power down", "spare-0", "\r", "\x1b"} {
		if strings.Contains(got, not) {
			t.Errorf("summary shows %q:\n%s", not, got)
		}
	}
	p.doing("worker joins and both nodes are Ready")
	if got := p.failed(); got != "worker joins and both nodes are Ready" {
		t.Errorf("failed() = %q, want the phase under way", got)
	}
}

// The refusal checks pick the join service's lines with these.
func TestLinesWith(t *testing.T) {
	log := "a refused x\nb admitted\nc refused y\n"
	if got := linesWith(log, "refused"); got != "a refused x\nc refused y" {
		t.Errorf("linesWith = %q", got)
	}
	if got := lastLine(log, "refused"); got != "c refused y" {
		t.Errorf("lastLine = %q", got)
	}
	if got := lastLine(log, "absent"); got != "" {
		t.Errorf("lastLine of no match = %q", got)
	}
}

// The suite waits out a slow API server, and only that.
func TestAPIUnreachable(t *testing.T) {
	for out, want := range map[string]bool{
		// kubectl apply on a starved control plane (CI, 2026-12-01).
		`error: error validating "web.yaml": error validating data: failed to download openapi: Get "https://10.42.0.2:6443/openapi/v2?timeout=32s": context deadline exceeded`: true,
		"dial tcp 10.42.0.2:6443: connect: connection refused":     true,
		`Error from server (NotFound): pods "web" not found`:       false,
		`Error from server (Forbidden): nodes "cp-0" is forbidden`: false,
	} {
		if got := apiUnreachable(out); got != want {
			t.Errorf("apiUnreachable(%q) = %v, want %v", out, got, want)
		}
	}
}
