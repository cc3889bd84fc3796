//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
)

// consoleCount counts the lines of n's console that contain s: a reset
// VM keeps its console, so a later boot's line is one more.
func consoleCount(n *cloud.Node, s string) int {
	raw, _ := os.ReadFile(n.SerialLog())
	return strings.Count(string(raw), s)
}

// waitConsoleMore waits until n's console has more lines with s than
// before.
func waitConsoleMore(t tester, ctx context.Context, n *cloud.Node, s string, before int, timeout time.Duration) {
	t.Helper()
	deadline := waitDeadline(t, timeout)
	for consoleCount(n, s) <= before {
		if time.Now().After(deadline) || ctx.Err() != nil {
			raw, _ := os.ReadFile(n.SerialLog())
			t.Fatalf("%s's console did not show %q again within %s:\n%s", n.Name, s, timeout, lastLines(string(raw), 40))
		}
		time.Sleep(3 * time.Second)
	}
}

// resetNode hard-resets n through QMP, as a power cut would.
func resetNode(t tester, ctx context.Context, n *cloud.Node) {
	t.Helper()
	if err := n.VM().Reset(ctx); err != nil {
		t.Fatalf("reset %s: %v", n.Name, err)
	}
}

// hostPathPod runs busybox on node with the node's /var/lib/orrery-e2e
// mounted at /data.
func hostPathPod(name, node, script string) string {
	return hostDirPod(name, node, "/var/lib/orrery-e2e", script)
}

// hostDirPod runs busybox on node with the node's folder dir mounted at
// /data: root on the node, as a container escape would have it.
func hostDirPod(name, node, dir, script string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default}
spec:
  nodeName: ` + node + `
  restartPolicy: Never
  tolerations: [{operator: Exists}]
  volumes: [{name: data, hostPath: {path: ` + dir + `, type: DirectoryOrCreate}}]
  containers:
  - name: c
    image: ghcr.io/flannel-io/flannel:v0.28.4
    imagePullPolicy: Never
    volumeMounts: [{name: data, mountPath: /data}]
    command: ["/usr/bin/busybox", "sh", "-c", "` + script + `"]
`
}

// runPod applies manifest and waits until the pod has finished or has
// printed want, and returns its log.
//
// Printing want is enough: the pod's work is done, and what the suite
// checks is in its log. Under emulation containerd can take minutes to
// notice that a container exited: a container that exits before its
// StartContainer call returns leaves the runc shim's task deletion
// waiting 10 s for the container's output to drain, which is all of the
// 10 s containerd's exit handler gives the whole deletion, and each retry
// fails the same way (containerd/containerd#13377). The pod then shows
// Running long after its process ended, which says nothing about Orrery.
func runPod(t tester, k kubectlFunc, dir, name, manifest, want string) string {
	t.Helper()
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := k("apply", "-f", path); err != nil {
		t.Fatalf("apply %s: %v\n%s", name, err, s)
	}
	deadline := waitDeadline(t, patience(10*time.Minute))
	for {
		phase, _ := k("get", "pod", name, "-o", "jsonpath={.status.phase}")
		if phase == "Succeeded" || phase == "Failed" {
			logs, _ := k("logs", name)
			return logs
		}
		if phase == "Running" {
			if logs, err := k("logs", name); err == nil && strings.Contains(logs, want) {
				t.Logf("pod %s printed %q and is still %s; not waiting for its exit to be recorded", name, want, phase)
				return logs
			}
		}
		if time.Now().After(deadline) {
			d, _ := k("describe", "pod", name)
			t.Fatalf("pod %s did not finish:\n%s", name, d)
		}
		time.Sleep(5 * time.Second)
	}
}

// writeWorkerFile has a pod write a file on the worker's state disk,
// which must survive the cloud's power cut (readWorkerFile).
func (s *suite) writeWorkerFile(worker *cloud.Node) {
	logs := runPod(s.t, s.k, s.dir, "write-state", hostPathPod("write-state", worker.Name, "echo before-reset > /data/marker && sync && cat /data/marker"), "before-reset")
	if !strings.Contains(logs, "before-reset") {
		s.t.Fatalf("the pod did not write its file on %s:\n%s", worker.Name, logs)
	}
}

// readWorkerFile checks that the file writeWorkerFile wrote is there
// after the worker was powered off without warning and rejoined.
func (s *suite) readWorkerFile(worker *cloud.Node) {
	logs := runPod(s.t, s.k, s.dir, "read-state", hostPathPod("read-state", worker.Name, "cat /data/marker"), "before-reset")
	if !strings.Contains(logs, "before-reset") {
		s.t.Fatalf("the file written before the power cut is gone from %s:\n%s", worker.Name, logs)
	}
}

// recoverControlPlane stops the whole cloud and starts it again, as
// 'orrery mini stop' and 'mini start' do: the only control plane's initrd
// finds no join service and waits for the owner, the worker's waits for
// the join service. 'orrery recover' with another cluster's master secret
// is refused; with the cluster's, the control plane comes back with its
// etcd data, and the worker rejoins by itself.
func (s *suite) recoverControlPlane() {
	t, k := s.t, s.k
	cp, worker := s.c.Nodes()[0], s.c.Nodes()[1]
	if out, err := k("-n", "default", "create", "configmap", "survives-reset", "--from-literal=value=kept"); err != nil {
		t.Fatalf("create configmap: %v\n%s", err, out)
	}
	s.plantStaticPod(cp)
	s.p.done("root on cp-0 changes its kube-scheduler static pod")
	before, boot, workerBoot := consoleCount(cp, "serving recovery on port"), bootID(t, k, cp.Name), bootID(t, k, worker.Name)
	if err := s.c.Stop(s.ctx); err != nil {
		t.Fatalf("stop the cloud: %v", err)
	}
	s.p.done("the cloud stopped: VMs powered off, disks kept")
	if err := s.c.Start(s.ctx); err != nil {
		t.Fatalf("start the stopped cloud: %v", err)
	}
	waitConsoleMore(t, s.ctx, cp, "serving recovery on port", before, patience(5*time.Minute))
	s.p.done("the cloud started again: cp-0 waits for recovery")
	s.readInitrdLog(cp)
	s.p.done("the owner reads cp-0's initrd log while it waits")
	s.recoverRefusesWrongSecret(cp)
	s.p.done("orrery recover with a wrong master secret is refused")
	recovered, err := inNS(s.ctx, s.recoverArgs(cp, filepath.Join(s.out, workspace.MasterSecretFile))...)
	t.Logf("orrery recover:\n%s", recovered)
	if err != nil {
		t.Fatalf("orrery recover: %v", err)
	}
	waitReady(t, k, cp.Name, boot, patience(10*time.Minute))
	s.p.done("orrery recover: cp-0 back and Ready")
	s.staticPodRewritten(cp)
	s.p.done("cp-0's changed static pod is kubeadm's again")
	if out, err := k("-n", "default", "get", "configmap", "survives-reset", "-o", "jsonpath={.data.value}"); err != nil || out != "kept" {
		t.Fatalf("the ConfigMap created before the stop: %v %q", err, out)
	}
	// The worker waits in its initrd until the join service answers
	// again, which follows cp-0's recovery and the restart of its whole
	// control plane, then boots beside it: 14 min from its power-on in
	// one run under TCG (the key after 7m40s), 5-6 min in others.
	waitReady(t, k, worker.Name, workerBoot, patience(20*time.Minute))
	s.p.done("worker-0 rejoins by itself and is Ready")
}

// The scheduler's port, as root on the control plane opens it to the
// network, and as kubeadm keeps it.
const schedulerOpened, schedulerClosed = "--bind-address=0.0.0.0", "--bind-address=127.0.0.1"

// plantStaticPod: root on cp opens the scheduler's port to the network
// in its static pod; after the restart, the pod must be kubeadm's again.
// The image has no /tmp; kubelet reads no file whose name starts with a
// dot.
func (s *suite) plantStaticPod(cp *cloud.Node) {
	logs := runPod(s.t, s.k, s.dir, "plant-static-pod", hostDirPod("plant-static-pod", cp.Name, "/etc/kubernetes/manifests",
		"sed s/"+schedulerClosed+"/"+schedulerOpened+"/ /data/kube-scheduler.yaml > /data/.planted && cat /data/.planted > /data/kube-scheduler.yaml && rm /data/.planted && grep -c -- "+schedulerOpened+" /data/kube-scheduler.yaml && echo planted"), "planted")
	if !strings.Contains(logs, "1\nplanted") {
		s.t.Fatalf("the pod did not change %s's kube-scheduler static pod:\n%s", cp.Name, logs)
	}
}

// staticPodRewritten checks that cp's console says the planted static
// pod was rewritten, and that it was.
func (s *suite) staticPodRewritten(cp *cloud.Node) {
	if consoleCount(cp, "rewrote the static pods kube-scheduler in") == 0 {
		s.t.Errorf("%s's console does not say that its changed kube-scheduler static pod was rewritten", cp.Name)
	}
	logs := runPod(s.t, s.k, s.dir, "read-static-pod", hostDirPod("read-static-pod", cp.Name, "/etc/kubernetes/manifests",
		"grep -c -- "+schedulerClosed+" /data/kube-scheduler.yaml; echo checked"), "checked")
	if !strings.Contains(logs, "1\nchecked") {
		s.t.Errorf("%s's kube-scheduler static pod after the restart is not kubeadm's:\n%s", cp.Name, logs)
	}
}

// readInitrdLog: while cp waits in its initrd, the owner reads its log
// from the node (by name: with the API server down, 'orrery mini”s state
// names it), and verify says it is not locked yet.
func (s *suite) readInitrdLog(cp *cloud.Node) {
	out, err := s.orreryAsOwner("logs", cp.Name, "-n", "50")
	s.t.Logf("orrery logs %s (in its initrd):\n%s", cp.Name, lastLines(out, 4))
	if err != nil || !strings.Contains(out, "serving recovery on port") {
		s.t.Errorf("the owner could not read %s's initrd log: %v\n%s", cp.Name, err, out)
	}
	out, err = s.orreryAsOwner("verify", cp.IP.String())
	if err == nil || !strings.Contains(out, "locked to no cluster yet") {
		s.t.Errorf("orrery verify of a node in its initrd: %v\n%s", err, out)
	}
}

// recoverRefusesWrongSecret tries 'orrery recover' with another
// cluster's master secret, in a workspace that records the same control
// plane (recover gives the key to that node alone).
func (s *suite) recoverRefusesWrongSecret(cp *cloud.Node) {
	t := s.t
	intruder := t.TempDir()
	for _, name := range []string{workspace.StateFile, workspace.KubeconfigFile} {
		b, err := os.ReadFile(filepath.Join(s.out, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(intruder, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	wrong := filepath.Join(intruder, workspace.MasterSecretFile)
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.WriteMasterSecretFile(wrong, ms); err != nil {
		t.Fatal(err)
	}
	refused, err := inNS(s.ctx, s.recoverArgs(cp, wrong)...)
	if err == nil || !strings.Contains(string(refused), "refused the master secret") {
		t.Fatalf("orrery recover with another cluster's master secret: err %v\n%s", err, refused)
	}
}

// recoverArgs is 'orrery recover' of cp with the master secret in
// secret.
func (s *suite) recoverArgs(cp *cloud.Node, secret string) []string {
	return append([]string{s.orr, "recover", "--node", cp.IP.String(), "--mini-dir", s.dir, "--master-secret", secret, "--timeout", "5m"}, s.ownerChecks()...)
}

// bootID is node's boot ID as its kubelet reports it: it changes with
// every boot.
func bootID(t tester, k kubectlFunc, node string) string {
	t.Helper()
	s, err := k("get", "node", node, "-o", "jsonpath={.status.nodeInfo.bootID}")
	if err != nil || s == "" {
		t.Fatalf("boot ID of %s: %v %q", node, err, s)
	}
	return s
}

// waitReady waits until node reports Ready from a boot other than the
// one with ID oldBoot: a Ready condition from before a reset does not
// count.
func waitReady(t tester, k kubectlFunc, node, oldBoot string, timeout time.Duration) {
	t.Helper()
	deadline := waitDeadline(t, timeout)
	for {
		s, err := k("get", "node", node, "-o", `jsonpath={.status.nodeInfo.bootID} {.status.conditions[?(@.type=="Ready")].status}`)
		if boot, ready, _ := strings.Cut(s, " "); err == nil && boot != oldBoot && ready == "True" {
			return
		}
		if time.Now().After(deadline) {
			nodes, _ := k("get", "nodes", "-o", "wide")
			t.Fatalf("%s not Ready again within %s:\n%s", node, timeout, nodes)
		}
		time.Sleep(5 * time.Second)
	}
}

func mustRead(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
