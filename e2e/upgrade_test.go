//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/owner/upgrade"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
)

var helm = flag.String("helm", "build/components/hostbin/helm", "the helm CLI built with the components")

// nextVersion is the version of the orrery the suite upgrades to.
const nextVersion = "0.99.0-e2e"

// buildOrrery builds the CLI as version into dir/name; servicesImage, if
// not empty, replaces the join service's image in its chart (one that
// cannot start, for an upgrade that must roll back).
func buildOrrery(t tester, ctx context.Context, dir, name, version, servicesImage string) string {
	t.Helper()
	ldflags := "-X github.com/orrery-dev/orrery/internal/buildinfo.Version=" + version
	if servicesImage != "" {
		ldflags += " -X github.com/orrery-dev/orrery/internal/owner/charts.servicesImage=" + servicesImage
	}
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, "./cli")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	return out
}

// upgradeCheck runs 'orrery upgrade check -o json' with bin.
func upgradeCheck(t tester, ctx context.Context, bin, kubeconfig string, extra ...string) upgrade.Report {
	t.Helper()
	b, err := inNS(ctx, append([]string{bin, "upgrade", "check", "--kubeconfig", kubeconfig, "-o", "json"}, extra...)...)
	if err != nil {
		t.Fatalf("upgrade check: %v\n%s", err, b)
	}
	var r upgrade.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("upgrade check -o json: %v\n%s", err, b)
	}
	return r
}

// upgradeServices runs 'orrery upgrade' on the cluster as an owner would:
// nothing to do with the same orrery; a newer one upgrades every release
// after backing up Orrery's objects; one whose join service never starts
// is rolled back by itself; helm sees it all, and 'helm rollback' works.
// It leaves the newer orrery in s.next.
func (s *suite) upgradeServices() {
	s.sameOrreryChangesNothing()
	s.p.done("upgrade check and apply with the same orrery change nothing")
	s.next = buildOrrery(s.t, s.ctx, s.dir, "orrery-next", nextVersion, "")
	backup := s.upgradeToNext()
	s.p.done("upgrade apply to newer charts (backup, then 3 releases)")
	s.restoreBackup(backup)
	s.p.done("backups restore with kubectl; helm list shows the upgrade")
	s.brokenUpgradeRollsBack()
	s.p.done("a release whose pods never get ready is rolled back; the old revision serves")
	s.helmRollback()
	s.p.done("helm history shows the revisions; helm rollback, then orrery upgrades again")
}

// backups is where the suite's upgrades back up Orrery's objects.
func (s *suite) backups() string { return filepath.Join(s.dir, "orrery-backups") }

// upgradeApply runs bin's 'upgrade apply' with the owner's workspace.
func (s *suite) upgradeApply(bin string, args ...string) (string, error) {
	b, err := inNS(s.ctx, append([]string{bin, "upgrade", "apply", "--kubeconfig", s.kubeconfig(), "--workspace", s.out, "--backup-dir", s.backups()}, args...)...)
	s.t.Logf("%s upgrade apply %s:\n%s", filepath.Base(bin), strings.Join(args, " "), b)
	return string(b), err
}

// helmRun runs helm on the cluster's kube-system namespace.
func (s *suite) helmRun(args ...string) string {
	b, err := inNS(s.ctx, append([]string{*helm, "--kubeconfig", s.kubeconfig(), "-n", "kube-system"}, args...)...)
	if err != nil {
		s.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return string(b)
}

// sameOrreryChangesNothing: the orrery that installed the cluster finds
// it current.
func (s *suite) sameOrreryChangesNothing() {
	r := upgradeCheck(s.t, s.ctx, s.orr, s.kubeconfig())
	if !r.UpToDate || len(r.Images) != 1 || !slices.Contains(r.Images[0].Nodes, "cp-0") || !slices.Contains(r.Images[0].Nodes, "worker-0") {
		s.t.Fatalf("upgrade check on a new cluster: %+v, want current and one image run by cp-0 and worker-0", r)
	}
	if out, err := s.upgradeApply(s.orr, "--yes"); err != nil || !strings.Contains(out, "Everything is current") {
		s.t.Fatalf("upgrade apply with the orrery that installed the cluster: %v", err)
	}
}

// upgradeToNext: a dry run with the newer orrery changes nothing, then a
// real one backs up and upgrades the three releases. It returns the
// backup's folder.
func (s *suite) upgradeToNext() string {
	t := s.t
	if out, err := s.upgradeApply(s.next, "--dry-run"); err != nil || !strings.Contains(out, "Dry run") || !strings.Contains(out, "-> "+nextVersion) {
		t.Fatalf("dry run: %v", err)
	}
	if _, err := os.Stat(s.backups()); err == nil {
		t.Fatal("a dry run or a run with nothing to do wrote a backup")
	}
	start := time.Now()
	if out, err := s.upgradeApply(s.next, "--yes", "--timeout", patience(5*time.Minute).String()); err != nil || !strings.Contains(out, "Upgraded 3 release(s)") {
		t.Fatalf("upgrade apply to %s: %v", nextVersion, err)
	}
	t.Logf("upgrade apply of the services: %s (goal 2 min)", time.Since(start).Round(time.Second))
	entries, err := os.ReadDir(s.backups())
	if err != nil || len(entries) != 1 {
		t.Fatalf("backups: %v %v", entries, err)
	}
	return filepath.Join(s.backups(), entries[0].Name())
}

// restoreBackup checks the backup: the definitions and every object of
// them, one file each, restorable with kubectl; and helm's view of the
// upgrade.
func (s *suite) restoreBackup(backup string) {
	t, k := s.t, s.k
	for _, f := range []string{"crds/measurementsets.orrery.dev.yaml", "crds/admittednodes.orrery.dev.yaml"} {
		if _, err := os.Stat(filepath.Join(backup, f)); err != nil {
			t.Errorf("the backup lacks %s: %v", f, err)
		}
	}
	records, _ := filepath.Glob(filepath.Join(backup, "resources", "admittednodes.orrery.dev", "_cluster", "*.yaml"))
	sets, _ := filepath.Glob(filepath.Join(backup, "resources", "measurementsets.orrery.dev", "_cluster", "*.yaml"))
	if len(records) != 2 || len(sets) != 1 {
		t.Errorf("the backup holds %d admitted nodes and %d measurement sets, want 2 and 1", len(records), len(sets))
	}
	if out, err := k("apply", "--server-side", "--force-conflicts", "-f", filepath.Join(backup, "crds")); err != nil {
		t.Errorf("kubectl apply of the backed-up CRDs: %v\n%s", err, out)
	}
	if out, err := k("apply", "--server-side", "--force-conflicts", "-R", "-f", filepath.Join(backup, "resources")); err != nil {
		t.Errorf("kubectl apply of the backed-up resources: %v\n%s", err, out)
	}
	if list := s.helmRun("list", "-o", "json"); strings.Count(list, `"chart":"`) != 3 || strings.Count(list, "-"+nextVersion+`"`) != 3 {
		t.Errorf("helm list does not show the three releases at %s:\n%s", nextVersion, list)
	}
	if out, err := k("-n", "kube-system", "rollout", "status", "daemonset/orrery-joinservice", timeoutFlag(5*time.Minute)); err != nil {
		t.Fatalf("the join service after the upgrade: %v\n%s", err, out)
	}
}

// brokenUpgradeRollsBack: an orrery of the same version whose join
// service never starts: orrery-services is rolled back, the others are
// current.
func (s *suite) brokenUpgradeRollsBack() {
	t, k := s.t, s.k
	broken := buildOrrery(t, s.ctx, s.dir, "orrery-broken", nextVersion, "localhost/orrery/joinservice:does-not-exist")
	const timeout = 90 * time.Second
	start := time.Now()
	out, err := s.upgradeApply(broken, "--yes", "--timeout", timeout.String())
	if err == nil || !strings.Contains(out, "orrery-services: rolled back to revision 2") {
		t.Fatalf("an upgrade whose pods never get ready: err %v, want orrery-services rolled back to revision 2", err)
	}
	// Each of the two waits (the upgrade's pods, then the rolled-back
	// revision's) is bounded by --timeout; the backup and Helm's own
	// calls get two minutes: on a control plane that used all of its 2
	// vCPUs (TCG, guests 2.6 times slower than usual) they took 1m14s,
	// past the minute they had been given, where an unbounded wait
	// would have taken until the suite's deadline.
	overhead := patience(2 * time.Minute)
	if took := time.Since(start); took > 2*timeout+overhead {
		t.Errorf("the failed upgrade took %s, more than twice its timeout and %s", took.Round(time.Second), overhead)
	}
	image, _ := k("-n", "kube-system", "get", "daemonset", "orrery-joinservice", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if strings.Contains(image, "does-not-exist") {
		t.Errorf("the join service still runs the failed revision's image %s", image)
	}
	if out, err := k("-n", "kube-system", "rollout", "status", "daemonset/orrery-joinservice", timeoutFlag(5*time.Minute)); err != nil {
		t.Fatalf("the join service after the rollback: %v\n%s", err, out)
	}
}

// helmRollback: helm's history shows the revisions; the rollback is
// Orrery's state again (nothing to do); the owner rolls back with helm,
// and orrery upgrades from there.
func (s *suite) helmRollback() {
	hist := s.helmRun("history", "orrery-services")
	for _, want := range []string{"orrery init", "orrery upgrade " + nextVersion, "Rollback to 2"} {
		if !strings.Contains(hist, want) {
			s.t.Errorf("helm history orrery-services lacks %q:\n%s", want, hist)
		}
	}
	if out, err := s.upgradeApply(s.next, "--yes"); err != nil || !strings.Contains(out, "Everything is current") {
		s.t.Errorf("after the rollback: %v", err)
	}
	s.helmRun("rollback", "orrery-services", "1", "--wait", "--timeout", patience(5*time.Minute).String())
	if out, err := s.upgradeApply(s.next, "--yes"); err != nil || !strings.Contains(out, "orrery-services: chart 0.") {
		s.t.Fatalf("upgrade after 'helm rollback': %v", err)
	}
}

// rolloverImage shows a rollout of a new node image: a node of an image
// that trusts this one's join services (orrery.trust_join_service on its
// command line) is refused until the owner adds its measurements, then
// joins; once its set is retired, its rejoin after a reset is refused.
func (s *suite) rolloverImage(node *cloud.Node) {
	t, ctx, c, k, dir, p := s.t, s.ctx, s.c, s.k, s.dir, s.p
	t.Helper()
	old, err := policy.Load(filepath.Join(s.img, snpMeasurements))
	if err != nil {
		t.Fatal(err)
	}
	trust, err := joinconn.TrustValue(old.PCRs)
	if err != nil {
		t.Fatal(err)
	}
	newDir := filepath.Join(dir, "new-image")
	if err := os.MkdirAll(newDir, 0o755); err != nil {
		t.Fatal(err)
	}
	qcow, err := modifiedImage(ctx, s.img, newDir, "e2e.new-image=1 "+joinconn.TrustParam+"="+trust)
	if err != nil {
		t.Fatalf("build the new image: %v", err)
	}
	newMeas := filepath.Join(newDir, snpMeasurements)
	root := filepath.Join(dir, cloud.SEVSNPTestRoot)
	newSet := setOf(t, newMeas, root)

	// The node boots while the join service is away, so that it also
	// shows a joining node outlasting a join-service restart: it keeps
	// asking while the service is down, then while the service refuses
	// it, and joins once the owner accepts its image.
	stopJoinService(t, k)
	startSpare(t, ctx, c, cloud.SpareOptions{Image: qcow}, node)
	p.watch(ctx, node)
	// Its first failure may be the metadata service's, before its network
	// is up: wait for one that names the join service.
	line := waitConsoleLine(t, ctx, node, patience(10*time.Minute), "no join ticket yet", joinServiceAddr(c))
	t.Logf("%s tried to join while the join service was down:\n%s", node.Name, truncate(line, 500))
	p.done("a node of a new image tries to join while the join service is down")
	startJoinService(t, k)
	waitRefused(t, k, node, 0, patience(10*time.Minute))
	p.done("the join service is back and refuses the node of a new image")

	r := upgradeCheck(t, ctx, s.next, s.kubeconfig(), "--measurements", newMeas, "--snp-test-root", root)
	if len(r.Measurements) != 1 || r.Measurements[0].Accepted || r.Measurements[0].Set != newSet {
		t.Fatalf("upgrade check of the new image's measurements: %+v", r.Measurements)
	}
	run := func(args ...string) (string, error) { return s.upgradeApply(s.next, args...) }
	if s, err := run("--yes", "--measurements", newMeas, "--snp-test-root", root); err != nil || !strings.Contains(s, "accept image "+newSet) {
		t.Fatalf("accept the new image: %v", err)
	}
	waitReadyNode(t, k, node.Name, patience(15*time.Minute))
	r = upgradeCheck(t, ctx, s.next, s.kubeconfig())
	found := false
	for _, im := range r.Images {
		found = found || (im.Set == newSet && slices.Contains(im.Nodes, node.Name))
	}
	if !found {
		t.Errorf("upgrade check does not list %s under the new image %s: %+v", node.Name, newSet, r.Images)
	}
	p.done("after --measurements the node of the new image joins")

	if s, err := run("--yes", "--retire", newSet); err == nil || !strings.Contains(s+err.Error(), "still the image of node(s) "+node.Name) {
		t.Fatalf("retiring an image a node runs: %v, want it refused naming %s", err, node.Name)
	}
	if _, err := run("--yes", "--force", "--retire", newSet); err != nil {
		t.Fatalf("--force --retire: %v", err)
	}
	before := refusals(k, node)
	resetNode(t, ctx, node)
	waitRefused(t, k, node, before, patience(10*time.Minute))
	p.done("after --retire the node's rejoin is refused")
}

// refusals counts the join service's refusals of node in its log.
func refusals(k kubectlFunc, node *cloud.Node) int {
	n := 0
	// The peer is logged as address:port.
	peer := node.IP.String() + ":"
	for _, line := range strings.Split(joinServiceLog(k, -1), "\n") {
		if strings.Contains(line, "refused a node") && strings.Contains(line, peer) {
			n++
		}
	}
	return n
}

// waitRefused waits until the join service has refused node more than
// before times.
func waitRefused(t tester, k kubectlFunc, node *cloud.Node, before int, timeout time.Duration) {
	t.Helper()
	deadline := waitDeadline(t, timeout)
	for refusals(k, node) <= before {
		if time.Now().After(deadline) {
			t.Fatalf("the join service did not refuse %s (%s) within %s:\n%s", node.Name, node.IP, timeout, lastLines(joinServiceLog(k, 30), 30))
		}
		time.Sleep(5 * time.Second)
	}
}

// setOf is the measurement set of a measurements file, with the test
// root the owner names.
func setOf(t tester, path, testRoot string) string {
	t.Helper()
	p, err := policy.LoadWithTestRoot(path, testRoot)
	if err != nil {
		t.Fatal(err)
	}
	s, err := measurementset.FromPolicy(p, "")
	if err != nil {
		t.Fatal(err)
	}
	return s.Name
}

// waitReadyNode waits until node is Ready.
func waitReadyNode(t tester, k kubectlFunc, node string, timeout time.Duration) {
	t.Helper()
	deadline := waitDeadline(t, timeout)
	for {
		s, err := k("get", "node", node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && s == "True" {
			return
		}
		if time.Now().After(deadline) {
			nodes, _ := k("get", "nodes", "-o", "wide")
			t.Fatalf("%s not Ready within %s\n%s\n%s", node, timeout, nodes, joinServiceLog(k, 30))
		}
		time.Sleep(5 * time.Second)
	}
}
