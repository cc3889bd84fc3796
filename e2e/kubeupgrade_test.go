//go:build e2e

package e2e

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/versions"
)

// servedPort is the NodePort of the Service that serves through the
// Kubernetes upgrade.
const servedPort = 30080

// servedManifest is a Deployment of two pages, which may run on the
// control plane too (so that the only worker can be drained), spread
// over the nodes, with a PodDisruptionBudget that keeps one serving, and
// a NodePort Service in front: what an owner runs through an upgrade.
const servedManifest = `apiVersion: apps/v1
kind: Deployment
metadata: {name: served, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: served}}
  template:
    metadata: {labels: {app: served}}
    spec:
      tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
      topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: served}}}]
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: ghcr.io/flannel-io/flannel:v0.28.4
        imagePullPolicy: Never
        command: ["/usr/bin/busybox", "sh", "-c", "mkdir -p /www && echo served > /www/index.html && exec busybox httpd -f -p 8080 -h /www"]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 2}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: served, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: served}}
---
apiVersion: v1
kind: Service
metadata: {name: served, namespace: default}
spec:
  type: NodePort
  selector: {app: served}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
`

// upgradeKubernetes upgrades the running cluster from the image's older
// release to its newer one with 'orrery upgrade apply
// --kubernetes-version', while a Deployment serves through a Service and
// the host asks it for its page four times a second; it counts the
// requests that failed. Every kubelet and control-plane component then
// runs the newer release, the same command again changes nothing, and
// going back is refused.
func (s *suite) upgradeKubernetes() {
	t, k := s.t, s.k
	vs := versions.List()
	from, to := vs[0], vs[len(vs)-1]
	s.assertRunsRelease(from)
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
	out, err := s.orreryAsOwner("upgrade", "apply", "--kubernetes-version", versions.Minor(to), "--dry-run")
	if err != nil || !strings.Contains(out, "cp-0 (control plane, kubelet "+from+"): kubeadm upgrade apply") || !strings.Contains(out, "worker-0 (worker, kubelet "+from+"): drain") {
		t.Fatalf("upgrade apply --dry-run: %v\n%s", err, out)
	}
	addr := net.JoinHostPort(s.c.Nodes()[0].IP.String(), strconv.Itoa(servedPort))
	tr, err := startTraffic(addr, 250*time.Millisecond, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	out, err = s.orreryAsOwner("upgrade", "apply", "--kubernetes-version", versions.Minor(to), "--yes", "--backup-dir", s.kubeBackups())
	total, failed, first := tr.stop()
	t.Logf("orrery upgrade apply --kubernetes-version %s:\n%s", versions.Minor(to), out)
	if err != nil {
		t.Fatalf("upgrade apply --kubernetes-version: %v", err)
	}
	t.Logf("during the Kubernetes upgrade, %d of %d requests to the Service failed; the first failures: %q", failed, total, first)
	s.p.done("orrery upgrade apply --kubernetes-version " + to + ": " + strconv.Itoa(failed) + " of " + strconv.Itoa(total) + " requests failed")
	s.assertRunsRelease(to)
	s.upgradeKubernetesAgain(from, to)
	if out, err := k("delete", "-f", path, "--wait=false"); err != nil {
		t.Fatalf("delete the served Deployment: %v\n%s", err, out)
	}
	s.p.done("every node and component runs " + to + "; again changes nothing; going back is refused")
}

// upgradeKubernetesAgain: the same upgrade again changes nothing, and
// one back to from is refused before anything changes.
func (s *suite) upgradeKubernetesAgain(from, to string) {
	t := s.t
	out, err := s.orreryAsOwner("upgrade", "apply", "--kubernetes-version", to, "--yes")
	if err != nil || !strings.Contains(out, "Every node runs Kubernetes "+to+": nothing to do") {
		t.Fatalf("the same Kubernetes upgrade again: %v\n%s", err, out)
	}
	out, err = s.orreryAsOwner("upgrade", "apply", "--kubernetes-version", versions.Minor(from), "--yes")
	if err == nil || !strings.Contains(out, "cannot be downgraded") || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("an upgrade back to %s: %v\n%s", from, err, out)
	}
	snapshots, _ := filepath.Glob(filepath.Join(s.kubeBackups(), "*", "etcd-snapshot.db"))
	if len(snapshots) != 1 {
		t.Fatalf("etcd snapshots in the workspace: %q, want the one the upgrade took", snapshots)
	}
	if fi, err := os.Stat(snapshots[0]); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < 1<<20 {
		t.Fatalf("the etcd snapshot: %v, want a private file of more than a MiB", err)
	}
}

// kubeBackups is where the Kubernetes upgrade keeps its etcd snapshot.
func (s *suite) kubeBackups() string { return filepath.Join(s.out, "kubernetes-backups") }

// assertRunsRelease waits until every node's kubelet, every control
// plane's components, kube-proxy and CoreDNS run release v, and no pod of
// kube-system another release's image: the old add-ons' pods take a while
// to go.
func (s *suite) assertRunsRelease(v string) {
	t := s.t
	rel, err := versions.Get(v)
	if err != nil {
		t.Fatal(err)
	}
	deadline := waitDeadline(t, patience(5*time.Minute))
	for {
		problems := s.releaseProblems(rel)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster does not run Kubernetes %s alone:\n%s", v, strings.Join(problems, "\n"))
		}
		time.Sleep(5 * time.Second)
	}
}

// releaseProblems lists what does not run release rel.
func (s *suite) releaseProblems(rel versions.Release) []string {
	v := rel.KubernetesVersion
	nodes, err := s.k("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.nodeInfo.kubeletVersion}{"\n"}{end}`)
	if err != nil {
		return []string{"list the nodes: " + err.Error()}
	}
	var problems []string
	for _, line := range strings.Fields(nodes) {
		if !strings.HasSuffix(line, "="+v) {
			problems = append(problems, "node "+line+", want kubelet "+v)
		}
	}
	images, err := s.k("-n", "kube-system", "get", "pods,daemonsets,deployments", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.containers[0].image}{.spec.template.spec.containers[0].image}{"\n"}{end}`)
	if err != nil {
		return append(problems, "list kube-system's images: "+err.Error())
	}
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "kube-proxy", "coredns"} {
		im, ok := rel.Image(name)
		if !ok {
			s.t.Fatalf("release %s has no image %s", v, name)
		}
		if !strings.Contains(images, "="+im.Ref+"\n") {
			problems = append(problems, "kube-system runs no "+im.Ref)
		}
		for _, other := range versions.List() {
			r, _ := versions.Get(other)
			if o, _ := r.Image(name); other != v && o.Ref != im.Ref && strings.Contains(images, "="+o.Ref+"\n") {
				problems = append(problems, "kube-system still runs "+o.Ref+" of Kubernetes "+other)
			}
		}
	}
	return problems
}
