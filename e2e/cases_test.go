//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-tpm-tools/client"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/gcp"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/launch"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// badInit is an 'orrery init' with bad input, and what its output must
// say.
type badInit struct {
	name          string
	args          []string
	want          []string
	before, after func()
}

// badInits are the cases of refuseBadInit, with their files written into
// the cloud's folder.
func (s *suite) badInits() []badInit {
	t, dir := s.t, s.dir
	good := filepath.Join(s.img, snpMeasurements)
	root := filepath.Join(dir, cloud.SEVSNPTestRoot)
	p, err := policy.Load(good)
	if err != nil {
		t.Fatal(err)
	}
	p = p.Copy()
	p.PCRs[11] = measurements.Measurement{Expected: make([]byte, measurements.DigestSize)}
	raw, err := p.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	wrongMeas := filepath.Join(dir, "wrong-measurements.json")
	wrongSecret := filepath.Join(dir, "wrong-init-secret")
	if err := os.WriteFile(wrongMeas, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wrongSecret, []byte("not-the-init-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	debug := func(on bool) func() {
		return func() {
			if err := s.c.SetSEVSNPDebug("cp-0", on); err != nil {
				t.Fatal(err)
			}
		}
	}
	return []badInit{
		// First, so that it also waits for the node to boot.
		{name: "measurements that do not match the node", args: []string{"--measurements", wrongMeas, "--snp-test-root", root},
			want: []string{"not running the expected image", "PCR 11 mismatch"}},
		{name: "SEV-SNP reports under a test root the owner did not name", args: []string{"--measurements", good},
			want: []string{"SEV-SNP report does not verify", "could not be verified by any trusted roots"}},
		{name: "an SEV-SNP report of a debug VM", args: s.ownerChecks(),
			want: []string{"guest policy debug is allowed"}, before: debug(true), after: debug(false)},
		{name: "a wrong init secret", args: append(s.ownerChecks(), "--init-secret-file", wrongSecret),
			want: []string{"wrong init secret"}},
		{name: "an unsupported Kubernetes version", args: append(s.ownerChecks(), "--kubernetes-version", "v1.20.0"),
			want: []string{"Kubernetes v1.20.0 is not supported by this image"}},
	}
}

// refuseBadInit runs 'orrery init' with bad input against the booting
// control plane. Each must fail with an error that says what is wrong and
// leave the node as it was (the real init that follows proves the node
// lock was not taken and the disk not re-keyed).
func (s *suite) refuseBadInit() {
	t := s.t
	for i, tc := range s.badInits() {
		outDir := filepath.Join(s.dir, "bad-init", string(rune('a'+i)))
		args := append([]string{s.orr, "init", "--mini-dir", s.dir, "--workspace", outDir, "--timeout", "15m", "--skip-services"}, tc.args...)
		if tc.before != nil {
			tc.before()
		}
		out, err := inNS(s.ctx, args...)
		if tc.after != nil {
			tc.after()
		}
		if err == nil {
			t.Fatalf("orrery init with %s succeeded:\n%s", tc.name, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Fatalf("orrery init with %s: output lacks %q:\n%s", tc.name, w, out)
			}
		}
		if _, err := os.Stat(filepath.Join(outDir, "orrery-admin.conf")); err == nil {
			t.Fatalf("orrery init with %s wrote a kubeconfig", tc.name)
		}
		// Only a node that attested gets a master secret made for it; the
		// wrong init secret is the one case here whose node attested.
		if _, err := os.Stat(filepath.Join(outDir, "orrery-master-secret.json")); err == nil && tc.name != "a wrong init secret" {
			t.Fatalf("orrery init with %s wrote a master secret for a node it refused", tc.name)
		}
		t.Logf("orrery init with %s: refused as expected:\n%s", tc.name, lastLines(string(out), 3))
	}
	s.verifyBeforeInit()
}

// verifyBeforeInit shows what the owner sees of the node's hardware
// before handing it the cluster's secrets.
func (s *suite) verifyBeforeInit() {
	cp := s.c.Nodes()[0]
	out, err := inNS(s.ctx, append([]string{s.orr, "verify", "--node", cp.IP.String(), "--platform-ca", filepath.Join(s.dir, cloud.PlatformCACert)}, s.ownerChecks()...)...)
	if err != nil {
		s.t.Fatalf("orrery verify %s: %v\n%s", cp.Name, err, out)
	}
	for _, w := range []string{"attested as gcp-sev-snp", "Its hardware report (verified):", "measurement:", "guest policy:", "debug not allowed", "NOT A REAL CPU"} {
		if !strings.Contains(string(out), w) {
			s.t.Fatalf("orrery verify %s: output lacks %q:\n%s", cp.Name, w, out)
		}
	}
	s.t.Logf("orrery verify %s:\n%s", cp.Name, out)
}

// stopJoinService takes the join service's pods away (a node selector
// no node has), as a restart or an outage of the service would.
func stopJoinService(t tester, k kubectlFunc) {
	t.Helper()
	const pause = `{"spec":{"template":{"spec":{"nodeSelector":{"orrery.dev/e2e-paused":"true"}}}}}`
	if s, err := k("-n", "kube-system", "patch", "daemonset", "orrery-joinservice", "-p", pause); err != nil {
		t.Fatalf("stop the join service: %v\n%s", err, s)
	}
	if s, err := k("-n", "kube-system", "wait", "--for=delete", "pod", "-l", "app=orrery-joinservice", timeoutFlag(5*time.Minute)); err != nil {
		t.Fatalf("join service pods did not go away: %v\n%s", err, s)
	}
}

// startJoinService brings back what stopJoinService took away.
func startJoinService(t tester, k kubectlFunc) {
	t.Helper()
	const resume = `{"spec":{"template":{"spec":{"nodeSelector":{"orrery.dev/e2e-paused":null}}}}}`
	if s, err := k("-n", "kube-system", "patch", "daemonset", "orrery-joinservice", "-p", resume); err != nil {
		t.Fatalf("bring the join service back: %v\n%s", err, s)
	}
}

// startSpare boots the next spare slot, which must be want (slots boot
// in order).
func startSpare(t tester, ctx context.Context, c *cloud.Cloud, opts cloud.SpareOptions, want *cloud.Node) {
	t.Helper()
	n, err := c.StartSpare(ctx, opts)
	if err != nil {
		t.Fatalf("start a spare node: %v", err)
	}
	if n != want {
		t.Fatalf("started %s, want %s", n.Name, want.Name)
	}
}

// joinServiceLog is the join container's log (the pod also runs the key
// service), its last tail lines or all of it with -1.
func joinServiceLog(k func(...string) (string, error), tail int) string {
	logs, _ := k("-n", "kube-system", "logs", "-l", "app=orrery-joinservice", "-c", "join", fmt.Sprintf("--tail=%d", tail))
	return logs
}

// powerOff powers n off, to free the host's cores for the next VM.
func powerOff(t tester, ctx context.Context, n *cloud.Node) {
	t.Helper()
	// A node powered off here is done with: it need not shut down
	// cleanly, and a worker took the whole minute it was given to.
	if err := n.VM().PowerDown(ctx, 10*time.Second); err != nil {
		t.Fatalf("power off %s: %v", n.Name, err)
	}
}

// refusedModified checks both refusals a modified image meets, with the
// real cluster:
//   - a node booted from it refuses the join service (the service attests
//     first, as a control plane of an image that is not the node's), names
//     the PCRs that differ, gets no ticket and never becomes a node;
//   - the join service refuses a node that does not check it back: a vTPM
//     that the cloud's platform CA certified, as it does every VM's, with
//     measurements that are not the image's. The test plays that node from
//     the host with swtpm, as an attacker with a modified bootstrapperd
//     would.
func (s *suite) refusedModified(modified *cloud.Node) {
	t, ctx, c, k, dir := s.t, s.ctx, s.c, s.k, s.dir
	t.Helper()
	modDir := filepath.Join(dir, "modified-image")
	if err := os.MkdirAll(modDir, 0o755); err != nil {
		t.Fatal(err)
	}
	qcow, err := modifiedImage(ctx, s.img, modDir, "e2e.modified=1")
	if err != nil {
		t.Fatalf("build the modified image: %v", err)
	}
	startSpare(t, ctx, c, cloud.SpareOptions{Image: qcow}, modified)
	// A whole boot to bootstrapperd's first join attempt, as for the late
	// joiner: under hack/stress-e2e.sh the refusal came about 6
	// minutes after power-on, at 270 s of the guest's uptime.
	line := waitConsoleLine(t, ctx, modified, patience(10*time.Minute), "refused a join service", "PCR 4 mismatch")
	t.Logf("%s refused the join service:\n%s", modified.Name, truncate(line, 1500))
	if s, err := k("get", "node", modified.Name, "--ignore-not-found", "-o", "name"); err != nil || strings.TrimSpace(s) != "" {
		t.Fatalf("the node from the modified image is in the cluster (%v): %s", err, s)
	}
	if raw, _ := os.ReadFile(modified.SerialLog()); strings.Contains(string(raw), "got a join ticket") {
		t.Fatalf("the node from the modified image got a join ticket")
	}

	ca, err := platformca.Load(dir)
	if err != nil {
		t.Fatalf("the local cloud's platform CA: %v", err)
	}
	attacker := qemutest.NewInstance(t, ca, platformca.NewInstance(modified.Name))
	// First as a plain vTPM node, leaving the SEV-SNP report out: the
	// cluster's sets are all SEV-SNP sets, so no set even looks at it.
	refusal := joinServiceRefusal(t, ctx, c, k, attacker.Issuer)
	if !strings.Contains(refusal, "accepts no qemu-vtpm image") {
		t.Errorf("the join service's refusal of a node without an SEV-SNP report does not say it accepts no qemu-vtpm node:\n%s", refusal)
	}
	// Then with a genuine report of the cloud's chip, as the host (which
	// plays the hardware here) can make: the PCRs still decide.
	chip, err := snpsim.Load(dir)
	if err != nil {
		t.Fatalf("the local cloud's simulated chip: %v", err)
	}
	fw, err := launch.FirmwareFile(vm.DefaultFirmware().Code)
	if err != nil {
		t.Fatal(err)
	}
	withReport, err := gcp.NewSEVSNPIssuer(gcp.IssuerConfig{OpenTPM: attacker.TPM.Open, MeasurementLog: attacker.Log,
		OpenTEE: func() (client.TEEDevice, error) {
			return &client.SevSnpQuoteProvider{QuoteProvider: snp.QuoteProvider{GetReport: func(d [64]byte) ([]byte, error) {
				return chip.ExtendedReport(snpsim.Guest{Measurement: fw, Policy: abi.SnpPolicy{SMT: true}}, d)
			}}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	refusal = joinServiceRefusal(t, ctx, c, k, withReport)
	for _, pcr := range []string{"PCR 4 mismatch", "PCR 9 mismatch", "PCR 11 mismatch"} {
		if !strings.Contains(refusal, pcr) {
			t.Errorf("the join service's refusal does not name %s:\n%s", pcr, refusal)
		}
	}
	t.Logf("the join service refused a node with foreign measurements:\n%s", truncate(refusal, 1500))
}

// joinServiceRefusal attests to the join service from the host with
// issuer, expects to be refused, and returns the join service's log line
// of the refusal.
func joinServiceRefusal(t tester, ctx context.Context, c *cloud.Cloud, k func(...string) (string, error), issuer attestation.Issuer) string {
	t.Helper()
	before := strings.Count(joinServiceLog(k, -1), "refused a node")
	// A handshake that gets no verdict is not an admission: a busy control
	// plane under TCG has let one run past its minute, and a joining node
	// would retry too. Only a verdict ends this, and only a refusal passes.
	deadline := time.Now().Add(patience(6 * time.Minute))
	for attempt := 1; ; attempt++ {
		start := time.Now()
		// The VMs' network lives in the cloud's network namespace.
		err := c.Network().Do(func() error {
			return attestToJoinService(ctx, issuer, joinServiceAddr(c))
		})
		if err == nil {
			t.Fatalf("a node with measurements that are not the image's attested to the join service, and the join service admitted it")
		}
		if strings.Contains(err.Error(), "server refused this client") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node with measurements that are not the image's attested to the join service: want it refused, got no verdict in %d attempts, the last: %v", attempt, err)
		}
		t.Logf("attempt %d at the join service got no verdict after %s (%v); trying again. Its last lines:\n%s",
			attempt, time.Since(start).Round(time.Second), err, lastLines(joinServiceLog(k, 40), 40))
		time.Sleep(5 * time.Second)
	}
	logs := joinServiceLog(k, -1)
	if slow := linesWith(logs, "was slow"); slow != "" {
		t.Logf("the join service logged slow steps so far:\n%s", lastLines(slow, 10))
	}
	if strings.Count(logs, "refused a node") <= before {
		t.Fatalf("the join service did not log refusing the host's swtpm node:\n%s", lastLines(logs, 30))
	}
	return lastLine(logs, "refused a node")
}

// attestToJoinService runs the attested-TLS handshake with the join
// service at addr as a node that attests with issuer and, unlike
// bootstrapperd, takes any join service: what a modified bootstrapperd
// would do before it asks for a ticket.
func attestToJoinService(ctx context.Context, issuer attestation.Issuer, addr string) error {
	creds, err := atls.NewCredentials(atls.Config{Issuer: issuer})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer raw.Close()
	conn, _, err := creds.ClientHandshake(ctx, addr, raw)
	if err == nil {
		conn.Close()
	}
	return err
}

// linesWith is the lines of s that contain what.
func linesWith(s, what string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// lastLine is the last line of s that contains what.
func lastLine(s, what string) string {
	return lastLines(linesWith(s, what), 1)
}

// assertNothingLeft checks what 'orrery mini down' must remove: the
// namespace, the VMs' processes, their disks and sockets.
func assertNothingLeft(t tester, dir string, nodes []*cloud.Node) {
	t.Helper()
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), namespace) {
		t.Errorf("network namespace %s is left after mini down", namespace)
	}
	if out, err := exec.Command("pgrep", "-f", dir).Output(); err == nil {
		t.Errorf("processes using %s are left after mini down: %s", dir, out)
	}
	if _, err := os.Stat(filepath.Join(dir, cloud.StateFile)); err == nil {
		t.Errorf("the cloud's state file is left after mini down")
	}
	for _, n := range nodes {
		left, _ := os.ReadDir(n.Dir)
		for _, e := range left {
			if filepath.Ext(e.Name()) != ".log" { // kept on purpose (KeepLogs)
				t.Errorf("%s is left after mini down", filepath.Join(n.Dir, e.Name()))
			}
		}
	}
}

// joinServiceAddr is the join service's address as a node dials it: its
// port on the first control plane.
func joinServiceAddr(c *cloud.Cloud) string {
	return net.JoinHostPort(c.Nodes()[0].IP.String(), strconv.Itoa(joinpb.Port))
}

// waitConsoleLine waits for a line of n's console that contains all of
// words, and returns it.
func waitConsoleLine(t tester, ctx context.Context, n *cloud.Node, timeout time.Duration, words ...string) string {
	t.Helper()
	deadline := waitDeadline(t, timeout)
	for {
		raw, _ := os.ReadFile(n.SerialLog())
		if line := findLine(string(raw), words...); line != "" {
			return line
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s's console never showed a line with %q:\n%s", n.Name, words, lastLines(string(raw), 40))
		}
		time.Sleep(3 * time.Second)
	}
}

func findLine(s string, all ...string) string {
	for _, line := range strings.Split(s, "\n") {
		ok := true
		for _, w := range all {
			ok = ok && strings.Contains(line, w)
		}
		if ok {
			return line
		}
	}
	return ""
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// assertJoinedWithNodeCert checks that node asked for its kubelet
// certificate as itself, with the certificate the join service signed
// for it, and that no node used a bootstrap token: a token would let a
// node ask for any node's certificate.
func assertJoinedWithNodeCert(t tester, k func(...string) (string, error), node string) {
	t.Helper()
	out, err := k("get", "csr", "-o", `jsonpath={range .items[*]}{.spec.signerName} {.spec.username}{"\n"}{end}`)
	if err != nil {
		t.Fatalf("list certificate signing requests: %v\n%s", err, out)
	}
	var mine bool
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		signer, user, _ := strings.Cut(line, " ")
		if signer != "kubernetes.io/kube-apiserver-client-kubelet" {
			continue
		}
		if strings.HasPrefix(user, "system:bootstrap:") {
			t.Errorf("a kubelet asked for its certificate with a bootstrap token (%s)", user)
		}
		mine = mine || user == "system:node:"+node
	}
	if !mine {
		t.Errorf("no kubelet certificate request from system:node:%s; requests:\n%s", node, out)
	}
}

// removeWorker removes worker for good with 'orrery node remove', then
// hard-resets it: the VM boots its genuine image with its old disk and
// asks for its disk key, and the join service refuses it. Its Node stays
// gone.
func (s *suite) removeWorker(worker *cloud.Node) {
	t, ctx, k := s.t, s.ctx, s.k
	t.Helper()
	b, err := inNS(ctx, s.orr, "node", "remove", worker.Name, "--yes", "--kubeconfig", s.kubeconfig(), "--drain-timeout", patience(3*time.Minute).String())
	t.Logf("orrery node remove %s:\n%s", worker.Name, b)
	if err != nil || !strings.Contains(string(b), "gets no join or rejoin ticket again") {
		t.Fatalf("orrery node remove %s: %v", worker.Name, err)
	}
	want := `"node":"` + worker.Name + `"`
	before := strings.Count(joinServiceLog(k, -1), "refused a rejoin")
	resetNode(t, ctx, worker)
	deadline := waitDeadline(t, patience(10*time.Minute))
	for {
		var line string
		for _, l := range strings.Split(joinServiceLog(k, -1), "\n") {
			if strings.Contains(l, "refused a rejoin") && strings.Contains(l, want) {
				line = l
			}
		}
		if line != "" && strings.Count(joinServiceLog(k, -1), "refused a rejoin") > before {
			t.Logf("the join service refused the removed %s: %s", worker.Name, truncate(line, 400))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the join service did not refuse the removed %s's rejoin:\n%s\n%s's console:\n%s", worker.Name, lastLines(joinServiceLog(k, 30), 30), worker.Name, lastLines(mustRead(worker.SerialLog()), 20))
		}
		time.Sleep(5 * time.Second)
	}
	if s, err := k("get", "node", worker.Name, "-o", "name"); err == nil {
		t.Errorf("the removed %s is a node again: %s", worker.Name, s)
	}
}

// workerIdentity is a credential root on a worker holds, as kubectl's
// impersonation flags and as the user and groups the API server would then
// check: impersonating a service account adds its groups.
type workerIdentity struct {
	as     []string
	user   string
	groups []string
	// needs is an access the credential needs and must be allowed. A
	// review with the wrong user or groups is denied everything; this
	// control keeps such a review from passing the audit.
	needs access
}

func serviceAccount(name string, needs access) workerIdentity {
	user := "system:serviceaccount:kube-system:" + name
	return workerIdentity{
		as:     []string{"--as=" + user},
		user:   user,
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
		needs:  needs,
	}
}

// workerIdentities are the credentials root on a worker holds: its
// kubelet's, and the tokens of the pods that run on every worker (kube-proxy
// and flannel, DaemonSets) or may (CoreDNS).
var workerIdentities = []workerIdentity{
	{
		as:     []string{"--as=system:node:worker-0", "--as-group=system:nodes", "--as-group=system:authenticated"},
		user:   "system:node:worker-0",
		groups: []string{"system:nodes", "system:authenticated"},
		needs:  access{Verb: "get", Resource: "nodes", Name: "worker-0"},
	},
	serviceAccount("flannel", access{Verb: "list", Resource: "nodes"}),
	serviceAccount("kube-proxy", access{Verb: "list", Resource: "services"}),
	serviceAccount("coredns", access{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"}),
}

// access is what a SubjectAccessReview asks.
type access struct {
	Namespace string `json:"namespace,omitempty"`
	Verb      string `json:"verb"`
	Group     string `json:"group"`
	Resource  string `json:"resource"`
	Name      string `json:"name,omitempty"`
}

func (a access) String() string {
	s := a.Verb + " " + a.Resource
	if a.Group != "" {
		s += "." + a.Group
	}
	if a.Name != "" {
		s += "/" + a.Name
	}
	if a.Namespace != "" {
		s += " in " + a.Namespace
	}
	return s
}

// forbiddenOnWorkers is what no credential on a worker may do.
var forbiddenOnWorkers = []access{
	{"kube-system", "get", "", "secrets", "orrery-master-secret"},
	{"kube-system", "list", "", "secrets", ""},
	{"kube-system", "create", "", "pods", ""},
	{"kube-system", "create", "apps", "daemonsets", ""},
	{"kube-system", "patch", "apps", "daemonsets", ""},
	{"", "create", "rbac.authorization.k8s.io", "clusterrolebindings", ""},
	{"", "delete", "admissionregistration.k8s.io", "validatingadmissionpolicies", ""},
	{"kube-system", "update", "", "configmaps", "orrery-removed-nodes"},
	{"kube-system", "update", "", "configmaps", "orrery-join-config"},
}

// auditWorkerCredentials asks the real cluster what each credential on a
// worker may do: it logs 'kubectl auth can-i --list' for each (the record
// the security review reads), and fails if one may read the master secret
// or any Secret in kube-system, create pods or workloads, or change RBAC,
// admission policies or Orrery's configuration. Node writes are allowed by
// authorization (a kubelet writes its Node, flannel its status) and
// narrowed by admission policies, which the API server's authorizers do
// not see: those are tested against a real API server in
// internal/owner/charts.
//
// The questions go in one kubectl call, as SubjectAccessReviews: one
// 'kubectl auth can-i' each took about 14 s against an emulated control
// plane, 40 of them 9.5 min of a run.
func auditWorkerCredentials(t tester, k kubectlFunc) {
	t.Helper()
	for _, id := range workerIdentities {
		list, _ := k(append([]string{"auth", "can-i", "--list"}, id.as...)...)
		t.Logf("kubectl auth can-i --list %s:\n%s", strings.Join(id.as, " "), list)
	}
	type review struct {
		id      workerIdentity
		ask     access
		allowed bool // what the identity must be told
	}
	var reviews []review
	for i, id := range workerIdentities {
		for _, f := range forbiddenOnWorkers {
			// The Node authorizer lets any kubelet create pods;
			// NodeRestriction admits only mirror pods of its own node
			// that mount no Secret (tested in internal/owner/charts).
			if i == 0 && f.Resource == "pods" {
				continue
			}
			reviews = append(reviews, review{id, f, false})
		}
		reviews = append(reviews, review{id, id.needs, true})
	}
	items := make([]any, len(reviews))
	for i, r := range reviews {
		items[i] = map[string]any{
			"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
			"spec": map[string]any{"user": r.id.user, "groups": r.id.groups, "resourceAttributes": r.ask},
		}
	}
	raw, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "reviews.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// --validate=false: kubectl would first fetch the whole OpenAPI
	// document to check these, which an emulated API server did not serve
	// within kubectl's 32 s; the API server checks each review itself.
	out, err := k("create", "--validate=false", "-f", file, "-o", "json")
	if err != nil {
		t.Fatalf("kubectl create of the access reviews: %v\n%s", err, out)
	}
	// kubectl prints each created review as a JSON document of its own.
	type answer struct {
		Status struct {
			Allowed bool   `json:"allowed"`
			Reason  string `json:"reason"`
		} `json:"status"`
	}
	var answered []answer
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var a answer
		if err := dec.Decode(&a); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("kubectl's answer to the access reviews, after %d: %v\n%s", len(answered), err, lastLines(out, 20))
		}
		answered = append(answered, a)
	}
	if len(answered) != len(reviews) {
		t.Fatalf("kubectl answered %d of %d access reviews:\n%s", len(answered), len(reviews), lastLines(out, 20))
	}
	for i, r := range reviews {
		got := answered[i].Status
		switch {
		case got.Allowed && !r.allowed:
			t.Errorf("%s may %s (%s)", r.id.user, r.ask, got.Reason)
		case !got.Allowed && r.allowed:
			t.Errorf("%s may not %s, which it needs: the review's user or groups are not what the API server gives this credential", r.id.user, r.ask)
		}
	}
}
