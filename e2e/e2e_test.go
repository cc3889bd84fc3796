//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/boottimeline"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/versions"
)

var (
	imageDir = flag.String("image-dir", "build/image", "the built node image")
	orrery   = flag.String("orrery", "build/bin/orrery", "the orrery CLI")
	kubectl  = flag.String("kubectl", "build/components/hostbin/kubectl", "kubectl")
	logsDir  = flag.String("logs-dir", "build/e2e-logs", "where a failed run leaves its logs, in a folder named by its start time")
	slowdown = flag.Float64("slowdown", 1, "how many times longer than usual the suite waits for the cluster: for a host that runs other work (hack/stress-e2e.sh)")
	set      = flag.String("set", fullSet, "which cases to run: "+fullSet+" (make e2e), "+smokeSet+" (make e2e-smoke, CI: init, join, a Service across nodes, the worker's credentials, a modified image refused) "+kubernetesUpgradeSet+" (make e2e-kubernetes-upgrade: init at the image's older Kubernetes, the cluster upgraded to its newer one) , "+haSet+" (make e2e-ha: three control planes behind the cloud's load balancer, one lost, one removed) or "+idleSet+" (make idle-cost: what an idle cluster costs, see -idle-*)")
)

// The sets of cases -set names.
const (
	fullSet              = "full"
	smokeSet             = "smoke"
	kubernetesUpgradeSet = "kubernetes-upgrade"
	haSet                = "ha"
	idleSet              = "idle"
)

// patience is how long to wait for what takes up to d on a host that
// runs nothing else: d times -slowdown. The run's load is declared by
// whoever adds it; the phase table still shows what each phase took, so a
// slower cluster is visible, not hidden.
func patience(d time.Duration) time.Duration {
	return time.Duration(float64(d) * max(*slowdown, 1))
}

// timeoutFlag is kubectl's --timeout for a step that takes up to d on an
// idle host.
func timeoutFlag(d time.Duration) string { return "--timeout=" + patience(d).String() }

const namespace = "orrery-e2e"

type phases struct {
	start time.Time
	last  time.Time
	rows  []phase
	boots []*boottimeline.Watch
	// current names the phase under way, if it was named (doing): a
	// failed run says which one failed.
	current string
	// summary is printed after the tables (a failed run's).
	summary string
}

func (p *phases) done(name string) {
	now := time.Now()
	p.rows = append(p.rows, phase{name, now.Sub(p.last)})
	p.last = now
	p.current = ""
}

// doing names the phase that begins now.
func (p *phases) doing(name string) { p.current = name }

// failed names the phase a failed run failed in.
func (p *phases) failed() string {
	switch {
	case p.current != "":
		return p.current
	case len(p.rows) > 0:
		return "the one after " + strconv.Quote(p.rows[len(p.rows)-1].name)
	}
	return "mini up"
}

// watch adds n's boot to the timeline; n has just been powered on.
func (p *phases) watch(ctx context.Context, n *cloud.Node) {
	p.boots = append(p.boots, boottimeline.Follow(ctx, n.Name, n.SerialLog(), n.Started))
}

func (p *phases) print() {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PHASE\tDURATION")
	for _, r := range p.rows {
		fmt.Fprintf(w, "%s\t%s\n", r.name, r.took.Round(time.Second))
	}
	fmt.Fprintf(w, "total\t%s\n", time.Since(p.start).Round(time.Second))
	w.Flush()
	w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nBOOT STEP\tSINCE POWER-ON")
	for _, b := range p.boots {
		for _, r := range b.Rows() {
			fmt.Fprintln(w, r)
		}
	}
	w.Flush()
	fmt.Print(p.summary)
}

func inNS(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", namespace}, args...)...).CombinedOutput()
}

// apiOutage is how long kubectl retries while the API server does not
// answer: a slow host may make it pause, the suite must not fail on that
// alone (assertControlPlaneSteady tells whether it restarted).
const apiOutage = 3 * time.Minute

// kubectlRetrying runs kubectl in the suite's namespace, and again while
// the API server is unreachable, for up to patience(apiOutage).
func kubectlRetrying(t tester, ctx context.Context, argv []string) (string, error) {
	start := time.Now()
	for {
		b, err := inNS(ctx, argv...)
		if err == nil || !apiUnreachable(string(b)) || time.Since(start) > patience(apiOutage) || ctx.Err() != nil {
			return string(b), err
		}
		t.Logf("the API server does not answer (%s); kubectl %s again in 5 s", lastLines(strings.TrimSpace(string(b)), 1), argv[3])
		time.Sleep(5 * time.Second)
	}
}

// apiUnreachable tells kubectl's errors of an API server that is away
// from its answers. "request did not complete within requested timeout"
// is the API server's own 504 after its 60 s request timeout: a control
// plane starved by a busy host (other load on the machine's two cores)
// gave it to a pod's create once, and answered the same request later.
// "context deadline exceeded" is kubectl's own 32 s limit on discovery
// and OpenAPI requests: a starved control plane, building the OpenAPI
// document that apply's validation asks for (the API server builds it on
// the first request after a change, then keeps it), once took longer.
func apiUnreachable(out string) bool {
	for _, s := range []string{"connection refused", "i/o timeout", "TLS handshake timeout", "connection reset by peer",
		"the server is currently unable to handle the request", "etcdserver: request timed out", "http2: client connection lost",
		"unexpected EOF", "net/http: request canceled", "request did not complete within requested timeout",
		"context deadline exceeded", "Client.Timeout exceeded",
		// The load balancer with no control plane up closes at once.
		"Unable to connect to the server: EOF"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// controlPlaneRestarts is each control-plane component's restart count,
// as kubelet reports it.
func controlPlaneRestarts(t tester, k kubectlFunc) map[string]int {
	t.Helper()
	out, err := k("-n", "kube-system", "get", "pods", "-l", "tier=control-plane", "-o",
		`jsonpath={range .items[*]}{.metadata.labels.component}={.status.containerStatuses[0].restartCount} {end}`)
	if err != nil {
		t.Errorf("control-plane restart counts: %v\n%s", err, out)
		return nil
	}
	counts := map[string]int{}
	for _, f := range strings.Fields(out) {
		comp, n, _ := strings.Cut(f, "=")
		counts[comp], _ = strconv.Atoi(n)
	}
	return counts
}

// logLastEnds logs how the last container of each control-plane
// component that restarted since before ended: its reason, exit code and
// (the static pods keep them, FallbackToLogsOnError) its last log lines,
// so that a passing run too says why a component restarted.
func logLastEnds(t tester, k kubectlFunc, now, before map[string]int) {
	t.Helper()
	for _, comp := range slices.Sorted(maps.Keys(now)) {
		if now[comp] <= before[comp] {
			continue
		}
		out, err := k("-n", "kube-system", "get", "pods", "-l", "tier=control-plane,component="+comp, "-o",
			"jsonpath={.items[0].status.containerStatuses[0].lastState.terminated}")
		if err != nil {
			t.Logf("%s's last container: %v\n%s", comp, err, out)
			continue
		}
		var end struct {
			Reason     string `json:"reason"`
			ExitCode   int    `json:"exitCode"`
			StartedAt  string `json:"startedAt"`
			FinishedAt string `json:"finishedAt"`
			Message    string `json:"message"`
		}
		if err := json.Unmarshal([]byte(out), &end); err != nil {
			t.Logf("%s's last container: kubelet reports no end (%v): %q", comp, err, out)
			continue
		}
		t.Logf("%s's last container ran %s to %s and ended %s (exit code %d); its last lines:\n%s", comp,
			end.StartedAt, end.FinishedAt, end.Reason, end.ExitCode, strings.TrimSpace(end.Message))
	}
}

// steadyComponents are the control-plane components that must never
// restart but for a reboot: a slow host must slow the cluster down, not
// break it.
var steadyComponents = []string{"etcd", "kube-apiserver"}

// assertControlPlaneSteady fails the run if etcd or the API server
// restarted more often than in since (nil: ever), and returns the counts.
func assertControlPlaneSteady(t tester, k kubectlFunc, since map[string]int) map[string]int {
	t.Helper()
	now := controlPlaneRestarts(t, k)
	t.Logf("control-plane restarts: %v (before: %v)", now, since)
	logLastEnds(t, k, now, since)
	checkRestarts(t, now, since, 0)
	return now
}

// checkRestarts fails the run if etcd or the API server restarted more
// than allowed times between the counts since and now.
func checkRestarts(t tester, now, since map[string]int, allowed int) {
	t.Helper()
	for _, comp := range steadyComponents {
		if n := now[comp] - since[comp]; n > allowed {
			t.Errorf("%s restarted %d times in this part of the run, %d allowed (kubelet counts %d, %d when it began)", comp, n, allowed, now[comp], since[comp])
		}
	}
}

// restartedOnce waits until kubelet reports that the control plane's
// reboot restarted each component of before, and returns the counts: the
// baseline for the rest of the run. kubelet reports a static pod's new
// container late (etcd's count was seen to go from 0 to 1 minutes after
// the node was Ready), so a count read at once may miss the reboot. A
// steady component restarted more than once since before fails the run.
func restartedOnce(t tester, k kubectlFunc, before map[string]int) map[string]int {
	t.Helper()
	deadline := waitDeadline(t, patience(5*time.Minute))
	for {
		now := controlPlaneRestarts(t, k)
		done := now != nil
		for comp, n := range before {
			done = done && now[comp] > n
		}
		if done || time.Now().After(deadline) {
			t.Logf("control-plane restarts after the reboot: %v (before it: %v)", now, before)
			logLastEnds(t, k, now, before)
			checkRestarts(t, now, before, 1) // the reboot's
			return now
		}
		time.Sleep(10 * time.Second)
	}
}

// TestCluster brings up a cluster of simulated SEV-SNP VMs and runs the
// cases of -set in order: each leaves the cluster as the next one expects
// it.
func TestCluster(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the end-to-end suite needs root")
	}
	cases, ok := caseSets()[*set]
	if !ok {
		t.Fatalf("-set %q: want %s, %s, %s, %s or %s", *set, fullSet, smokeSet, kubernetesUpgradeSet, haSet, idleSet)
	}
	s := newSuite(t)
	defer s.p.print()
	s.up()
	defer s.down()
	s.p.done("mini up")
	for _, n := range s.c.Nodes() {
		if n.VM() != nil {
			s.p.watch(s.ctx, n)
		}
	}
	for _, c := range cases {
		if c.phase != "" {
			s.p.doing(c.phase)
		}
		c.run(s)
		if c.phase != "" {
			s.p.done(c.phase)
		}
	}
}

// clusterCase is one step of TestCluster.
type clusterCase struct {
	// phase names the case's row in the table of phases; a case that
	// names its own phases (one or several) has none.
	phase string
	run   func(*suite)
}

// caseSets are the sets -set names: the full run and the smoke run share
// coreCases; the Kubernetes upgrade has a run of its own, as it takes 20
// minutes under TCG, most of them kubeadm replacing the control plane's
// pods, and would double the full run.
func caseSets() map[string][]clusterCase {
	return map[string][]clusterCase{
		fullSet:              append(slices.Clone(coreCases), fullCases...),
		smokeSet:             append(slices.Clone(coreCases), smokeCases...),
		kubernetesUpgradeSet: kubernetesUpgradeCases,
		haSet:                haCases,
		idleSet:              idleCases,
	}
}

// coreCases run in the full and the smoke runs: init, join, a Service
// across nodes, the worker's credentials, the owner's view of the running
// nodes.
var coreCases = []clusterCase{
	{"orrery init refuses bad input (incl. node boot)", (*suite).refuseBadInit},
	{"", (*suite).init},
	{"a second init is refused", (*suite).secondInitRefused},
	{"", (*suite).workerJoins},
	{"join service, key service, CNI and CoreDNS ready", (*suite).servicesReady},
	{"", (*suite).serviceAcrossNodes},
	{"", (*suite).podTrafficEncrypted},
	{"the credentials on a worker may not reach the master secret", func(s *suite) { auditWorkerCredentials(s.t, s.k) }},
	{"", (*suite).kubeletServingCertificates},
	{"orrery verify checks every running node", (*suite).verifyRunningNodes},
	{"", (*suite).inspectWithKubeletStopped},
}

// smokeCases end a smoke run. Two host cores run two TCG VMs well, not
// three: the worker makes room for the modified image's node.
var smokeCases = []clusterCase{
	{"worker-0 powered off", func(s *suite) { powerOff(s.t, s.ctx, s.c.Nodes()[1]) }},
	{"a node from a modified image is refused", func(s *suite) { s.refusedModified(s.c.Nodes()[2]) }},
}

// fullCases end a full run: reboots, recovery, upgrades, a removed node,
// a modified image and a new one.
var fullCases = []clusterCase{
	// Steadiness is judged up to here, and from the control plane's
	// recovery to the end: a reboot restarts each container once, as it
	// should.
	{"", func(s *suite) { s.beforeReboot = assertControlPlaneSteady(s.t, s.k, nil) }},
	// The worker's rejoin is checked after the whole cloud's power cut,
	// which cuts its power as a reset would: a reset of its own would
	// take the same path, and 3 to 4 minutes more.
	{"a pod writes a file on the worker's state disk", func(s *suite) { s.writeWorkerFile(s.c.Nodes()[1]) }},
	{"", (*suite).recoverControlPlane},
	{"the worker's file survived the power cut", func(s *suite) { s.readWorkerFile(s.c.Nodes()[1]) }},
	{"", func(s *suite) { s.afterReboot = restartedOnce(s.t, s.k, s.beforeReboot) }},
	{"", func(s *suite) { s.serviceCheck("after the reboots, a pod on the worker reaches the Service again") }},
	{"", (*suite).upgradeServices},
	// The worker has done its part. Two host cores run three TCG VMs with
	// a responsive API server, not four: the late nodes take its place,
	// one at a time (with three VMs, the API server failed its liveness
	// probe and restarted).
	{"worker-0 removed with orrery node remove; its rejoin is refused", func(s *suite) { s.removeWorker(s.c.Nodes()[1]) }},
	{"worker-0 powered off", func(s *suite) { powerOff(s.t, s.ctx, s.c.Nodes()[1]) }},
	// Spare slots boot in order: spare-0 the modified image, spare-1 the
	// new image.
	{"a node from a modified image is refused", func(s *suite) { s.refusedModified(s.c.Nodes()[2]) }},
	{"the modified image's node powered off", func(s *suite) { powerOff(s.t, s.ctx, s.c.Nodes()[2]) }},
	{"", func(s *suite) { s.rolloverImage(s.c.Nodes()[3]) }},
	{"bootstrapperd's phases on the consoles; journals only through the API", (*suite).consolesAndJournals},
	// Since the control plane's recovery (its containers restarted once
	// with the node), etcd and the API server ran through the upgrades and
	// two more nodes' boots.
	{"", func(s *suite) {
		assertControlPlaneSteady(s.t, s.k, s.afterReboot)
		s.t.Logf("orrery init to both nodes Ready: %s (goal 8m)", s.initToReady.Round(time.Second))
	}},
}

// kubernetesUpgradeCases make a cluster at the image's older Kubernetes
// release and upgrade it to the newer one while it serves.
var kubernetesUpgradeCases = []clusterCase{
	{"", (*suite).init},
	{"", (*suite).workerJoins},
	{"join service, key service, CNI and CoreDNS ready", (*suite).servicesReady},
	// The upgrade replaces the control plane's pods: steadiness is judged
	// before it.
	{"", func(s *suite) { assertControlPlaneSteady(s.t, s.k, nil) }},
	{"", (*suite).upgradeKubernetes},
	// Whether the kubelet's switch restarted the pods kubeadm had just
	// replaced, and what the newer control plane costs.
	{"", func(s *suite) {
		s.t.Logf("control-plane restarts after the upgrade: %v", controlPlaneRestarts(s.t, s.k))
		logCPU(s.t, s.k, "cp-0", "after the Kubernetes upgrade")
	}},
}

// init runs the owner's 'orrery init', and adds its steps to the table
// of phases. The full and the HA runs take the default Kubernetes
// release, the image's newest; the others the oldest, which the
// Kubernetes upgrade starts from.
func (s *suite) init() {
	const phase = "orrery init (attestation, kubeadm, Helm services)"
	s.p.doing(phase)
	s.initStart = time.Now()
	args := []string{s.orr, "init", "--mini-dir", s.dir, "--workspace", s.out, "--timeout", "30m"}
	if *set == smokeSet || *set == kubernetesUpgradeSet {
		args = append(args, "--kubernetes-version", versions.Minor(versions.List()[0]))
	}
	out, err := inNS(s.ctx, append(args, s.ownerChecks()...)...)
	s.t.Logf("orrery init:\n%s", out)
	if err != nil {
		s.t.Fatalf("orrery init: %v", err)
	}
	s.p.done(phase)
	s.p.rows = append(s.p.rows, initSteps(string(out))...)
	logCPU(s.t, s.k, "cp-0", "just after orrery init")
}

// secondInitRefused: someone else's init on the initialised node is
// refused, and at once.
func (s *suite) secondInitRefused() {
	again, err := inNS(s.ctx, append([]string{s.orr, "init", "--mini-dir", s.dir, "--workspace", filepath.Join(s.dir, "intruder"), "--timeout", "5m"}, s.ownerChecks()...)...)
	if err == nil || !strings.Contains(string(again), "already belongs to a cluster") {
		s.t.Fatalf("a second init on the initialised node: err %v, output:\n%s\nwant 'already belongs to a cluster'", err, again)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "intruder", "orrery-master-secret.json")); err == nil {
		s.t.Fatal("the refused second init made a master secret: init must write nothing for a node it did not accept")
	}
}

// workerJoins waits for the worker to join by itself.
func (s *suite) workerJoins() {
	s.waitFor("worker joins and both nodes are Ready", patience(15*time.Minute), s.ready("cp-0", "worker-0"))
	logCPU(s.t, s.k, "cp-0", "with both nodes Ready")
	s.initToReady = time.Since(s.initStart)
}

// servicesReady checks how the worker joined, and waits for the
// cluster's own services.
func (s *suite) servicesReady() {
	assertJoinedWithNodeCert(s.t, s.k, "worker-0")
	for _, sel := range []string{"app=orrery-joinservice", "app=flannel", "k8s-app=kube-dns"} {
		if out, err := s.k("-n", "kube-system", "wait", "--for=condition=Ready", "pod", "-l", sel, timeoutFlag(10*time.Minute)); err != nil {
			s.t.Fatalf("pods %s not ready: %v\n%s", sel, err, out)
		}
	}
}

// webManifest serves a page from cp-0 behind a Service.
const webManifest = `apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  nodeName: cp-0
  tolerations: [{operator: Exists}]
  containers:
  - name: web
    image: ghcr.io/flannel-io/flannel:v0.28.4
    imagePullPolicy: Never
    command: ["/usr/bin/busybox", "sh", "-c", "mkdir -p /www && echo hello-from-cp-0 > /www/index.html && exec busybox httpd -f -p 8080 -h /www"]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// clientManifest asks the Service for its page from worker-0, through
// the cluster's DNS. Debian's static busybox crashes in wget (glibc
// NSS); nc works.
const clientManifest = `apiVersion: v1
kind: Pod
metadata: {name: CLIENT, namespace: default}
spec:
  nodeName: worker-0
  restartPolicy: Never
  containers:
  - name: client
    image: ghcr.io/flannel-io/flannel:v0.28.4
    imagePullPolicy: Never
    command:
    - /usr/bin/busybox
    - sh
    - -c
    - |
      # A node that just joined programs Service rules (kube-proxy) and
      # learns CoreDNS's endpoints a little later than the API reports
      # CoreDNS ready; until then 10.96.0.10 refuses. The client tries
      # for as long as the suite waits, less a minute, and says when it
      # gives up: its exit may not show in the pod's phase for minutes
      # (containerd/containerd#13377).
      end=$(( $(busybox date +%s) + 540 ))
      until busybox nslookup web.default.svc.cluster.local 10.96.0.10; do
        [ "$(busybox date +%s)" -lt "$end" ] || { echo "client gave up: no answer from the cluster DNS at 10.96.0.10"; exit 1; }
        sleep 3
      done
      until printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 3 $WEB_SERVICE_HOST 80; do
        [ "$(busybox date +%s)" -lt "$end" ] || { echo "client gave up: no page from the Service at $WEB_SERVICE_HOST"; exit 1; }
        sleep 3
      done
`

// serviceAcrossNodes serves a page on the control plane, and a pod on
// the worker gets it through a Service.
func (s *suite) serviceAcrossNodes() {
	const what = "a pod on the worker reaches a Service on the control plane"
	s.p.doing(what)
	if err := os.WriteFile(filepath.Join(s.dir, "web.yaml"), []byte(webManifest), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if out, err := s.k("apply", "-f", filepath.Join(s.dir, "web.yaml")); err != nil {
		s.t.Fatalf("apply: %v\n%s", err, out)
	}
	if out, err := s.k("wait", "--for=condition=Ready", "pod/web", timeoutFlag(10*time.Minute)); err != nil {
		s.t.Fatalf("web pod: %v\n%s", err, out)
	}
	s.serviceCheck(what)
}

// serviceCheck runs a client on the worker until the page arrived. Each
// check has a pod of its own name: with one name for all, the worker's
// kubelet, slow to learn that the last check's pod was deleted, served
// that pod's logs for the new one (the old page, then "not found"), and
// the check passed and failed on them.
func (s *suite) serviceCheck(what string) {
	s.t.Helper()
	s.serviceChecks++
	pod := fmt.Sprintf("client-%d", s.serviceChecks)
	file := filepath.Join(s.dir, pod+".yaml")
	os.WriteFile(file, []byte(strings.Replace(clientManifest, "CLIENT", pod, 1)), 0o644)
	if out, err := s.k("apply", "-f", file); err != nil {
		s.t.Fatalf("apply: %v\n%s", err, out)
	}
	// Done when the page arrived, or the pod gave up. Not when the pod
	// completes: on a starved worker (hack/stress-e2e.sh) the page came at
	// once, but containerd's handling of the container's exit timed out
	// again and again ("failed to delete task: context deadline
	// exceeded"), and the pod stayed Running for over ten minutes.
	s.waitFor(what, patience(10*time.Minute), func() bool {
		if logs, _ := s.k("logs", pod); strings.Contains(logs, "hello-from-cp-0") || strings.Contains(logs, "client gave up") {
			return true
		}
		phase, _ := s.k("get", "pod", pod, "-o", "jsonpath={.status.phase}")
		return phase == "Succeeded" || phase == "Failed"
	})
	logs, _ := s.k("logs", pod)
	if !strings.Contains(logs, "hello-from-cp-0") || !strings.Contains(logs, "Address") {
		s.t.Fatalf("%s on worker-0 did not get the page through the Service (or DNS failed):\n%s", pod, logs)
	}
	s.k("delete", "pod", pod, "--wait=false")
}

// consolesAndJournals: bootstrapperd's phases are on each node's
// console, the journal of kubelet, containerd and the pods is not (the
// host reads the console), and the owner reads a node's journal through
// the API server instead.
func (s *suite) consolesAndJournals() {
	for _, n := range []*cloud.Node{s.c.Nodes()[0], s.c.Nodes()[1], s.c.Nodes()[3]} {
		raw, _ := os.ReadFile(n.SerialLog())
		phases := []string{"waiting for init or join", "node locked to the new cluster", "running kubeadm init", "node bootstrapped"}
		if n.Role == role.Worker {
			phases = []string{"waiting for init or join", "got a join ticket", "node locked to the cluster", "running kubeadm join", "joined the cluster"}
		}
		for _, phase := range phases {
			if !strings.Contains(string(raw), phase) {
				s.t.Errorf("bootstrapperd's log on %s's console lacks %q", n.Name, phase)
			}
		}
		for _, other := range []string{"kubelet[", "containerd["} {
			if strings.Contains(string(raw), other) {
				s.t.Errorf("%s's console carries the journal (%q lines): journald forwards to the console", n.Name, other)
			}
		}
	}
	if logs, err := s.k("get", "--raw", "/api/v1/nodes/cp-0/proxy/logs/?query=bootstrapperd"); err != nil || !strings.Contains(logs, "node bootstrapped") {
		s.t.Errorf("cp-0's journal through kubelet's node log query: %v\n%s", err, lastLines(logs, 5))
	}
}

// teardown is the time kept, before go test's deadline, for stopping the
// VMs and keeping a failed run's logs.
const teardown = 3 * time.Minute

// runTime is how long the run may take: until go test's -timeout (make
// e2e E2E_TIMEOUT=...), less the time the teardown needs to stop the VMs
// and keep a failed run's logs, which a panic at the deadline would lose.
func runTime(t tester) time.Duration {
	deadline, ok := t.Deadline()
	if !ok {
		return 50 * time.Minute
	}
	return time.Until(deadline) - teardown
}

// waitDeadline is when a wait of timeout that starts now gives up: after
// timeout, or when the run's time is up, whichever is first. A wait that
// ran on to go test's deadline ended in its panic, which skips the
// teardown (a run that reached go test's deadline left the VMs, the
// network namespace and the logs, and the next run refused to start).
func waitDeadline(t tester, timeout time.Duration) time.Time {
	d := time.Now().Add(timeout)
	if end, ok := t.Deadline(); ok && end.Add(-teardown).Before(d) {
		return end.Add(-teardown)
	}
	return d
}

// askTime is how long a failed run asks the API server for its state:
// five minutes, as a slow cluster needs, but within the teardown's margin
// when the run failed at go test's deadline, with a minute left to stop
// the VMs.
func askTime(t tester) time.Duration {
	ask := 5 * time.Minute
	if deadline, ok := t.Deadline(); ok {
		ask = min(ask, time.Until(deadline)-time.Minute)
	}
	return max(ask, 30*time.Second)
}

// logCPU logs where node's CPU goes now, for the run's record of what a
// control plane costs under emulation.
func logCPU(t tester, k kubectlFunc, node, when string) {
	t.Helper()
	stats, err := k("get", "--raw", "/api/v1/nodes/"+node+"/proxy/stats/summary")
	if err != nil {
		t.Logf("%s's CPU %s: no stats summary: %v", node, when, err)
		return
	}
	table, err := cpuTable([]byte(stats))
	if err != nil {
		t.Logf("%s's CPU %s: %v", node, when, err)
		return
	}
	t.Logf("%s's CPU and memory %s (kubelet's stats summary):\n%s", node, when, table)
}

// failureTail is how many of their last lines failureSummary shows of
// each node's console and each of the owner's failure files.
const failureTail = 25

// failureErrorLines is how many of its last lines failureSummary shows of
// the error that failed the run: CI shows about 30 lines of the end, a
// dozen of them go test's own.
const failureErrorLines = 12

// failureSummary is what a failed run prints last (all CI shows at
// once): which phase failed, how Orrery's lines on each node's console
// (the initrd's, bootstrapperd's, orrery-images') and the owner's failure
// files end, and, last, the error that failed it. It is taken before the
// nodes are stopped, whose shutdown would fill the consoles' ends. None
// holds a secret: the host reads the consoles, 'orrery init' keeps
// secrets out of its failure files, and the suite's errors are the
// owner's commands' output, which never shows one.
func failureSummary(phase, failure string, nodes []*cloud.Node, ownerDir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\ne2e: FAILED in phase: %s\n", phase)
	for _, n := range nodes {
		raw, err := os.ReadFile(n.SerialLog())
		if err != nil {
			continue // a spare that never booted
		}
		fmt.Fprintf(&b, "\n--- %s's console, Orrery's last %d lines ---\n%s\n", n.Name, failureTail, lastLines(orreryLines(raw), failureTail))
	}
	logs, _ := filepath.Glob(filepath.Join(ownerDir, "orrery-init-*.log"))
	for _, path := range logs {
		if raw, err := os.ReadFile(path); err == nil {
			fmt.Fprintf(&b, "\n--- the owner's %s, last %d lines ---\n%s\n", filepath.Base(path), failureTail, lastLines(printable(string(raw)), failureTail))
		}
	}
	if failure == "" {
		fmt.Fprintf(&b, "\ne2e: FAILED in phase: %s (its errors are above, where it ran)\n", phase)
		return b.String()
	}
	fmt.Fprintf(&b, "\ne2e: FAILED in phase: %s, with (%d lines of it at most; the whole is above, where it ran):\n%s\n",
		phase, failureErrorLines, headAndTail(printable(failure), failureErrorLines))
	return b.String()
}

// headAndTail is s's first line and its last lines, n lines in all at
// most: an error's first line says what failed, its last ones how it
// ended (a command's output below it). Each line is cut to 300 bytes.
func headAndTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		skipped := len(lines) - (n - 1)
		lines = append([]string{lines[0], fmt.Sprintf("    … %d lines …", skipped)}, lines[len(lines)-(n-2):]...)
	}
	for i, l := range lines {
		lines[i] = truncate(l, 300)
	}
	return strings.Join(lines, "\n")
}

// orreryLines are the console lines of Orrery's programs.
func orreryLines(raw []byte) string {
	var out []string
	for _, l := range strings.Split(printable(string(raw)), "\n") {
		for _, p := range []string{"orrery-init: ", "bootstrapperd[", "orrery-images[", "orrery-pcrs["} {
			if strings.Contains(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// printable drops a console's carriage returns and escape sequences.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || r >= ' ' && r != 0x7f {
			return r
		}
		return -1
	}, s)
}

// ownerChecks are the flags with which the owner's commands check the
// suite's nodes: the image's SEV-SNP measurements, and the local cloud's
// test root, named as the owner must name it.
func ownerChecks(img, dir string) []string {
	return []string{"--measurements", filepath.Join(img, snpMeasurements), "--snp-test-root", filepath.Join(dir, cloud.SEVSNPTestRoot)}
}
