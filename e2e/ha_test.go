//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/owner/clusterstatus"
)

// haCases make a cluster of three control planes behind the cloud's
// load balancer: the second and third join once the owner approved them,
// the cluster serves while one is hard-reset, and one leaves.
var haCases = []clusterCase{
	{"", (*suite).init},
	{"join service, CNI and CoreDNS ready", (*suite).controlPlaneServicesReady},
	{"an unapproved control plane is refused", func(s *suite) { s.unapprovedRefused(s.c.Nodes()[1]) }},
	{"", (*suite).controlPlanesJoin},
	{"", func(s *suite) { s.loseAControlPlane(s.c.Nodes()[2]) }},
	{"", (*suite).recoverControlPlanes},
	{"", func(s *suite) { s.removeAControlPlane(s.c.Nodes()[2], s.c.Nodes()[1]) }},
}

// controlPlaneServicesReady waits for the cluster's own services on the
// first control plane.
func (s *suite) controlPlaneServicesReady() {
	for _, sel := range []string{"app=orrery-joinservice", "app=flannel", "k8s-app=kube-dns"} {
		if out, err := s.k("-n", "kube-system", "wait", "--for=condition=Ready", "pod", "-l", sel, timeoutFlag(10*time.Minute)); err != nil {
			s.t.Fatalf("pods %s not ready: %v\n%s", sel, err, out)
		}
	}
	out, err := s.k("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	want := "https://" + net.JoinHostPort(cloud.LoadBalancerIP.String(), strconv.Itoa(clusternet.APIServerPort))
	if err != nil || out != want {
		s.t.Fatalf("the owner's kubeconfig names %q (%v), want the cloud's load balancer %s", out, err, want)
	}
}

// unapprovedRefused: a VM that asks for a control plane's files before the
// owner approved it gets none; the join service says why, and it is no
// node.
func (s *suite) unapprovedRefused(n *cloud.Node) {
	deadline := waitDeadline(s.t, patience(10*time.Minute))
	for {
		logs, _ := s.k("-n", "kube-system", "logs", "-l", "app=orrery-joinservice", "-c", "join", "--tail=-1", "--prefix")
		if slices.ContainsFunc(strings.Split(logs, "\n"), func(l string) bool {
			return strings.Contains(l, "is not an approved control plane") && strings.Contains(l, `"node":"`+n.Name+`"`)
		}) {
			break
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the join service did not refuse %s's request for control-plane files; its log:\n%s", n.Name, lastLines(logs, 30))
		}
		time.Sleep(10 * time.Second)
	}
	if out, err := s.k("get", "node", n.Name); err == nil {
		s.t.Fatalf("%s, not approved, is a node:\n%s", n.Name, out)
	}
}

// controlPlanesJoin approves the other control planes one at a time, as
// the owner does: each joins, and its etcd member votes, before the next.
func (s *suite) controlPlanesJoin() {
	var names []string
	for i, n := range s.c.Nodes() {
		names = append(names, n.Name)
		if i == 0 {
			continue
		}
		id := s.instanceID(n)
		// The workspace records the approval, for 'orrery recover'.
		out, err := inNS(s.ctx, s.orr, "control-plane", "approve", id, "--workspace", s.out, "--kubeconfig", s.kubeconfig())
		if err != nil {
			s.t.Fatalf("control-plane approve %s: %v\n%s", id, err, out)
		}
		start := time.Now()
		stopCapture := s.captureJoinLog(n)
		// kubeadm waits up to 40 min for the joining control plane's own
		// API server (tlsBootstrapWait).
		s.waitFor(n.Name+" joins as a control plane (approve to Ready)", patience(45*time.Minute), s.ready(names...))
		stopCapture()
		s.waitEtcd(len(names), patience(10*time.Minute))
		s.t.Logf("%s: from its approval to its Node Ready and its etcd member voting: %s", n.Name, time.Since(start).Round(time.Second))
		s.p.done(n.Name + "'s etcd member votes")
	}
	out, err := s.orreryAsOwner("status")
	s.t.Logf("orrery status:\n%s", out)
	if err != nil || !strings.Contains(out, "Control-plane endpoint: https://"+cloud.LoadBalancerIP.String()) {
		s.t.Fatalf("orrery status: %v; want it to name the load balancer", err)
	}
	for _, n := range s.c.Nodes() {
		logCPU(s.t, s.k, n.Name, "with three control planes")
	}
	s.logEtcdTiming("once three control planes run")
}

// captureJoinLog saves n's bootstrapperd journal (kubeadm's output) beside
// its console log every few minutes until stopped, where a failed run's
// diagnostics take it from: a joining control plane starved of CPU
// stopped answering attested connections before its join failed, and the
// failed run's logs then had nothing of why.
func (s *suite) captureJoinLog(n *cloud.Node) (stop func()) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(3 * time.Minute):
			}
			// Only a capture that worked replaces the one before it.
			if out, err := s.orreryAsOwner("logs", n.IP.String(), "bootstrapperd", "-n", "400"); err == nil {
				_ = os.WriteFile(filepath.Join(n.Dir, joinLog), []byte(out), 0o600)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// instanceID is the instance ID n's platform certified, as 'orrery
// verify --node' tells the owner.
func (s *suite) instanceID(n *cloud.Node) string {
	out, err := s.orreryAsOwner("verify", "--node", n.IP.String(), "-o", "json")
	var v struct {
		InstanceID string `json:"instanceID"`
	}
	if err != nil || json.Unmarshal([]byte(jsonPart(out)), &v) != nil || v.InstanceID == "" {
		s.t.Fatalf("orrery verify --node %s: %v\n%s", n.IP, err, out)
	}
	return v.InstanceID
}

// jsonPart is out from its first '{' or '[' on: the CLI's warnings come
// before it on the same output.
func jsonPart(out string) string {
	if i := strings.IndexAny(out, "{["); i >= 0 {
		return out[i:]
	}
	return out
}

// etcdStatus is etcd's membership as 'orrery status' shows it.
func (s *suite) etcdStatus() (*clusterstatus.Etcd, error) {
	out, err := s.orreryAsOwner("status", "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, lastLines(out, 5))
	}
	var r clusterstatus.Report
	if err := json.Unmarshal([]byte(jsonPart(out)), &r); err != nil {
		return nil, fmt.Errorf("orrery status -o json: %w", err)
	}
	if r.Etcd == nil || r.Etcd.Error != "" {
		return nil, fmt.Errorf("orrery status shows no etcd members: %+v", r.Etcd)
	}
	return r.Etcd, nil
}

// waitEtcd waits until etcd has n healthy voting members.
func (s *suite) waitEtcd(n int, timeout time.Duration) *clusterstatus.Etcd {
	deadline := waitDeadline(s.t, timeout)
	for {
		e, err := s.etcdStatus()
		if err == nil {
			voting := 0
			for _, m := range e.Members {
				if m.Healthy && !m.Learner {
					voting++
				}
			}
			if voting == n && len(e.Members) == n {
				return e
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("etcd has not %d healthy voting members within %s: %+v (%v)", n, timeout, e, err)
		}
		time.Sleep(10 * time.Second)
	}
}

// apiTraffic reads from the API server through the kubeconfig's endpoint,
// four times a second.
func (s *suite) apiTraffic() *traffic {
	rc, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig())
	if err != nil {
		s.t.Fatal(err)
	}
	tlsCfg, err := rest.TLSConfigFor(rc)
	if err != nil {
		s.t.Fatal(err)
	}
	tr, err := startAsking(func() error { return askAPI(rc.Host, tlsCfg, 5*time.Second) }, 250*time.Millisecond)
	if err != nil {
		s.t.Fatal(err)
	}
	return tr
}

// loseAControlPlane hard-resets control plane n while the API server is
// read through the endpoint and a Deployment serves through a NodePort
// Service: both must go on; n rejoins by itself, through the other
// control planes' join services, and its etcd member catches up.
func (s *suite) loseAControlPlane(n *cloud.Node) {
	t, k := s.t, s.k
	path := filepath.Join(s.dir, "served.yaml")
	if err := os.WriteFile(path, []byte(servedManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := k("apply", "-f", path); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	if out, err := k("rollout", "status", "deployment/served", timeoutFlag(10*time.Minute)); err != nil {
		t.Fatalf("the served Deployment: %v\n%s", err, out)
	}
	s.p.done("a Deployment of two serves through a NodePort Service")
	bootID := func() string {
		out, _ := k("get", "node", n.Name, "-o", "jsonpath={.status.nodeInfo.bootID}")
		return out
	}
	before := bootID()
	leader := s.leaderIndex()
	service, err := startTraffic(net.JoinHostPort(s.c.Nodes()[0].IP.String(), strconv.Itoa(servedPort)), 250*time.Millisecond, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	api := s.apiTraffic()
	start := time.Now()
	if err := n.VM().Reset(s.ctx); err != nil {
		t.Fatalf("reset %s: %v", n.Name, err)
	}
	s.p.watch(s.ctx, n)
	s.waitFor(n.Name+" hard-reset, rejoins and is Ready", patience(25*time.Minute), func() bool {
		return bootID() != before && s.ready(n.Name)()
	})
	rejoined := time.Since(start)
	e := s.waitEtcd(3, patience(10*time.Minute))
	apiTotal, apiFailed, apiFirst := api.stop()
	svcTotal, svcFailed, svcFirst := service.stop()
	for _, m := range e.Members {
		if m.Name == n.Name && m.RaftIndex <= leader {
			t.Errorf("%s's etcd member is at raft index %d, not past the leader's %d when it was reset: it did not catch up", n.Name, m.RaftIndex, leader)
		}
	}
	t.Logf("%s: reset to Ready again in %s", n.Name, rejoined.Round(time.Second))
	s.logEtcdTiming("after " + n.Name + "'s reset")
	t.Logf("while %s was lost, %d of %d reads of the API server through the endpoint failed (first: %q), and %d of %d requests to the Service (first: %q)",
		n.Name, apiFailed, apiTotal, apiFirst, svcFailed, svcTotal, svcFirst)
	s.p.done(fmt.Sprintf("its etcd member caught up; API: %d of %d reads failed, Service: %d of %d", apiFailed, apiTotal, svcFailed, svcTotal))
	// The load balancer takes a lost control plane out within seconds:
	// more than a few failures in a row is an outage.
	if apiFailed*10 > apiTotal || svcFailed*10 > svcTotal {
		t.Errorf("more than a tenth of the requests failed while one control plane of three was lost")
	}
	if out, err := k("delete", "-f", path, "--wait=false"); err != nil {
		t.Fatalf("delete the served Deployment: %v\n%s", err, out)
	}
}

// leaderIndex is the raft index of etcd's leader now.
func (s *suite) leaderIndex() uint64 {
	e, err := s.etcdStatus()
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range e.Members {
		if m.Leader {
			return m.RaftIndex
		}
	}
	s.t.Fatalf("etcd has no leader: %+v", e.Members)
	return 0
}

// removeAControlPlane: with another control plane frozen, removing n
// would leave etcd without a quorum, and is refused; once that one is
// back, n goes, its etcd member first.
func (s *suite) removeAControlPlane(n, frozen *cloud.Node) {
	t := s.t
	if err := frozen.VM().QMP().Execute(s.ctx, "stop", nil, nil); err != nil {
		t.Fatalf("freeze %s: %v", frozen.Name, err)
	}
	out, err := s.orreryAsOwner("node", "remove", n.Name, "--yes")
	if err := frozen.VM().QMP().Execute(s.ctx, "cont", nil, nil); err != nil {
		t.Fatalf("thaw %s: %v", frozen.Name, err)
	}
	if err == nil || !strings.Contains(out, "lose its quorum") || !strings.Contains(out, "--break-etcd-quorum") {
		t.Fatalf("removing %s while %s is frozen: %v\n%s\nwant a refusal: etcd would lose its quorum", n.Name, frozen.Name, err, out)
	}
	s.p.done(fmt.Sprintf("removing %s while %s is frozen: refused, etcd would lose its quorum", n.Name, frozen.Name))
	s.waitEtcd(3, patience(10*time.Minute))
	out, err = s.orreryAsOwner("node", "remove", n.Name, "--yes")
	t.Logf("orrery node remove %s:\n%s", n.Name, out)
	if err != nil || !strings.Contains(out, "its etcd member is removed") {
		t.Fatalf("orrery node remove %s: %v", n.Name, err)
	}
	// The owner deletes the removed VM.
	powerOff(t, s.ctx, n)
	s.waitEtcd(2, patience(5*time.Minute))
	if out, err := s.k("get", "node", n.Name); err == nil {
		t.Fatalf("%s is still a node:\n%s", n.Name, out)
	}
	s.p.done(n.Name + " removed with orrery node remove, its etcd member first")
}

// recoverControlPlanes stops the whole cloud and starts it again: every
// control plane waits for its key, since no join service runs. 'orrery
// recover' gives it to cp-0, then cp-1, and stops there: etcd has its
// quorum, and cp-2 rejoins by itself through their join services. What
// etcd held before the stop is there after.
func (s *suite) recoverControlPlanes() {
	t, k := s.t, s.k
	if out, err := k("-n", "default", "create", "configmap", "survives-stop", "--from-literal=value=kept"); err != nil {
		t.Fatalf("create configmap: %v\n%s", err, out)
	}
	cps := s.c.Nodes()
	boots, waiting := map[string]string{}, map[string]int{}
	for _, n := range cps {
		boots[n.Name], waiting[n.Name] = bootID(t, k, n.Name), consoleCount(n, "serving recovery on port")
	}
	if err := s.c.Stop(s.ctx); err != nil {
		t.Fatalf("stop the cloud: %v", err)
	}
	s.p.done("the cloud stopped: VMs powered off, disks kept")
	if err := s.c.Start(s.ctx); err != nil {
		t.Fatalf("start the stopped cloud: %v", err)
	}
	for _, n := range cps {
		s.p.watch(s.ctx, n)
	}
	waitConsoleMore(t, s.ctx, cps[0], "serving recovery on port", waiting[cps[0].Name], patience(10*time.Minute))
	s.p.done("the cloud started again: cp-0 waits for recovery")
	args := append([]string{s.orr, "recover", "--mini-dir", s.dir, "--master-secret", filepath.Join(s.out, "orrery-master-secret.json"), "--timeout", "15m"}, s.ownerChecks()...)
	out, err := inNS(s.ctx, args...)
	t.Logf("orrery recover:\n%s", out)
	if err != nil {
		t.Fatalf("orrery recover: %v", err)
	}
	if !strings.Contains(string(out), "Recovering in this order") || !strings.Contains(string(out), "2 of 3 control planes are back") {
		t.Fatalf("orrery recover does not say which control planes it recovers and that it stopped at a majority")
	}
	s.p.done("orrery recover: cp-0, then cp-1, a majority")
	for _, n := range cps {
		waitReady(t, k, n.Name, boots[n.Name], patience(20*time.Minute))
	}
	s.waitEtcd(3, patience(10*time.Minute))
	if out, err := k("-n", "default", "get", "configmap", "survives-stop", "-o", "jsonpath={.data.value}"); err != nil || out != "kept" {
		t.Fatalf("the ConfigMap created before the stop: %v %q", err, out)
	}
	s.p.done("every control plane Ready, cp-2 by itself; etcd's three members healthy, its data kept")
}

// etcdSigns are what etcd logs when its timing is too tight for the
// machine: a heartbeat that went out late (the heartbeat interval), an
// election (the election timeout, or a member lost), a slow apply.
var etcdSigns = []struct{ name, line string }{
	{"late heartbeats", "failed to send out heartbeat on time"},
	{"elections won", "became leader at term"},
	{"slow applies", "apply request took too long"},
}

// logEtcdTiming counts, in each control plane's etcd log, the signs that
// its heartbeat interval and election timeout are too short for this
// machine.
func (s *suite) logEtcdTiming(when string) {
	var b strings.Builder
	for _, n := range s.c.Nodes() {
		logs, err := s.k("-n", "kube-system", "logs", "etcd-"+n.Name, "--tail=-1")
		if err != nil {
			fmt.Fprintf(&b, "  %s: no log (%v)\n", n.Name, err)
			continue
		}
		fmt.Fprintf(&b, "  %s:", n.Name)
		for _, sign := range etcdSigns {
			fmt.Fprintf(&b, " %s %d,", sign.name, strings.Count(logs, sign.line))
		}
		b.WriteString("\n")
	}
	s.t.Logf("etcd's timing %s (since each member's container started):\n%s", when, b.String())
}
