//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/role"
)

// suite is one run of TestCluster: the cloud, the owner's workspace, the
// table of phases, and what a case hands on to the cases after it.
type suite struct {
	t   *recordingT
	ctx context.Context
	c   *cloud.Cloud
	p   *phases
	// k runs kubectl as the owner, retrying while the API server is away.
	k    kubectlFunc
	diag *diagnostics
	// dir is the cloud's folder, out the owner's workspace, img the built
	// image's folder; orr and kc are the CLI and kubectl.
	dir, out, img, orr, kc string

	// initStart is when the real 'orrery init' began, initToReady how
	// long from then until both nodes were Ready.
	initStart   time.Time
	initToReady time.Duration
	// serviceChecks counts the client pods serviceCheck started.
	serviceChecks int
	// beforeReboot and afterReboot are the control plane's restart counts
	// before the reboots and once its recovery restarted each component.
	beforeReboot, afterReboot map[string]int
	// next is the newer orrery that upgradeServices built.
	next string
}

// newSuite brings the cloud up: 'orrery mini up' with a control plane, a
// worker, and spare slots for the nodes that boot later.
func newSuite(t *testing.T) *suite {
	img, _ := filepath.Abs(*imageDir)
	orr, _ := filepath.Abs(*orrery)
	kc, _ := filepath.Abs(*kubectl)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), runTime(t))
	t.Cleanup(cancel)
	rt := &recordingT{T: t}
	s := &suite{t: rt, ctx: ctx, dir: dir, out: filepath.Join(dir, "owner"), img: img, orr: orr, kc: kc,
		p: &phases{start: time.Now(), last: time.Now(), current: "mini up"}, diag: newDiagnostics(*logsDir)}
	s.k = func(args ...string) (string, error) {
		return kubectlRetrying(rt, ctx, append([]string{kc, "--kubeconfig", s.kubeconfig()}, args...))
	}
	return s
}

// up starts the cloud. In a full run two spare slots boot later: a node
// from a modified image, and a node of a new image that joins across a
// join-service restart and the cluster's refusal, and whose image the
// owner then retires; a smoke run boots only the first, the Kubernetes
// upgrade neither. The HA run has three control planes and no worker. Every VM is a simulated SEV-SNP confidential VM:
// the suite runs the gcp-sev-snp variant end to end, under the cloud's
// test root, which the owner names (ownerChecks).
func (s *suite) up() {
	spares := map[string]int{fullSet: 2, smokeSet: 1}[*set]
	controlPlanes, workers := 1, 1
	switch *set {
	case haSet:
		controlPlanes, workers = 3, 0
	case idleSet:
		workers = *idleWorkers
	}
	c, err := cloud.Up(s.ctx, cloud.Spec{
		Dir: s.dir, ControlPlanes: controlPlanes, Workers: workers, Spares: spares, CPUs: 2, MemoryMiB: 3072, StateDiskMiB: 8192,
		Image: filepath.Join(s.img, "disk.qcow2"), Namespace: namespace, KeepLogs: true, SEVSNP: true,
	})
	if err != nil {
		s.t.Fatalf("orrery mini up: %v", err)
	}
	s.c = c
}

// kubeconfig is the owner's admin kubeconfig, once init wrote it.
func (s *suite) kubeconfig() string { return filepath.Join(s.out, workspace.KubeconfigFile) }

// ownerChecks are the flags with which the owner checks the suite's
// nodes.
func (s *suite) ownerChecks() []string { return ownerChecks(s.img, s.dir) }

// down stops the cloud and checks that nothing is left; a failed run
// first keeps the nodes' and the cluster's logs.
func (s *suite) down() {
	failed := s.t.Failed()
	var kept []error
	if failed {
		kept = s.keepLogs()
	}
	if err := s.c.Down(context.Background()); err != nil {
		s.t.Errorf("down: %v", err)
	}
	assertNothingLeft(s.t, s.dir, s.c.Nodes())
	if s.t.Failed() {
		s.p.done("keeping the logs, mini down, nothing left")
	} else {
		s.p.done("mini down, nothing left")
	}
	if !failed {
		return
	}
	for _, err := range kept {
		s.t.Logf("keeping the logs: %v", err)
	}
	abs, _ := filepath.Abs(s.diag.dir)
	fmt.Printf("e2e: FAILED; the nodes' consoles and journals, the cluster's events, pods and logs are in %s\n", abs)
}

// keepLogs keeps a failed run's logs, and returns what it could not
// keep.
func (s *suite) keepLogs() []error {
	// Printed last, after the tables: CI's output ends there.
	s.p.summary = failureSummary(s.p.failed(), s.t.first, s.c.Nodes(), s.out)
	// The failed phase has its own row: otherwise its time would show as
	// the teardown's.
	s.p.done("FAILED (the phase that failed)")
	// The consoles and the owner's files first: they are local and
	// instant, while a struggling API server can use up the teardown's
	// margin before go test's deadline panics.
	errs := append(s.diag.nodeLogs(s.c.Nodes()), s.diag.ownerLogs(s.out)...)
	if _, err := os.Stat(s.kubeconfig()); err != nil {
		return errs
	}
	askCtx, cancel := context.WithTimeout(context.Background(), askTime(s.t))
	defer cancel()
	var names, controlPlanes []string
	for _, n := range s.c.Nodes() {
		if n.VM() == nil {
			continue // a spare that never booted
		}
		names = append(names, n.Name)
		if n.Role == role.ControlPlane {
			controlPlanes = append(controlPlanes, n.Name)
		}
	}
	ask := func(args ...string) (string, error) {
		b, err := inNS(askCtx, append([]string{s.kc, "--kubeconfig", s.kubeconfig(), "--request-timeout=30s"}, args...)...)
		return string(b), err
	}
	waited, err := awaitAPIServer(askCtx, ask)
	if err != nil {
		s.t.Logf("keeping the logs: %v; the cluster's state is not kept", err)
		return errs
	}
	s.t.Logf("keeping the logs: the API server answered after %s", waited.Round(time.Second))
	return append(errs, s.diag.clusterState(ask, names, controlPlanes)...)
}

// waitFor waits up to timeout until ok, as the phase what.
func (s *suite) waitFor(what string, timeout time.Duration, ok func() bool) {
	s.t.Helper()
	s.p.doing(what)
	deadline := waitDeadline(s.t, timeout)
	for !ok() {
		if time.Now().After(deadline) {
			nodes, _ := s.k("get", "nodes", "-o", "wide")
			pods, _ := s.k("get", "pods", "-A", "-o", "wide")
			s.t.Fatalf("%s: not within %s\n%s\n%s", what, timeout, nodes, pods)
		}
		time.Sleep(5 * time.Second)
	}
	s.p.done(what)
}

// ready tells whether all of names are Ready.
func (s *suite) ready(names ...string) func() bool {
	return func() bool {
		out, err := s.k("get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}")
		for _, n := range names {
			if err != nil || !strings.Contains(out, n+"=True") {
				return false
			}
		}
		return true
	}
}

// orreryAsOwner runs the CLI's command args[0] with the owner's
// workspace, the cloud's state and the owner's checks. The owner's flags
// come first, so a case's own flag overrides one (a string flag given
// twice takes the last).
func (s *suite) orreryAsOwner(args ...string) (string, error) {
	owner := append([]string{"--workspace", s.out, "--master-secret", filepath.Join(s.out, workspace.MasterSecretFile), "--kubeconfig", s.kubeconfig(), "--mini-dir", s.dir}, s.ownerChecks()...)
	cmd := append([]string{s.orr, args[0]}, owner...)
	b, err := inNS(s.ctx, append(cmd, args[1:]...)...)
	return string(b), err
}
