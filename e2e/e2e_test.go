//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
)

var (
	imageDir = flag.String("image-dir", "build/image", "the built node image")
	orrery   = flag.String("orrery", "build/bin/orrery", "the orrery CLI")
	kubectl  = flag.String("kubectl", "build/components/bin/kubectl", "kubectl")
)

const namespace = "orrery-e2e"

type phases struct {
	start time.Time
	last  time.Time
	rows  [][2]string
}

func (p *phases) done(name string) {
	now := time.Now()
	p.rows = append(p.rows, [2]string{name, now.Sub(p.last).Round(time.Second).String()})
	p.last = now
}

func (p *phases) print() {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PHASE\tDURATION")
	for _, r := range p.rows {
		fmt.Fprintf(w, "%s\t%s\n", r[0], r[1])
	}
	fmt.Fprintf(w, "total\t%s\n", time.Since(p.start).Round(time.Second))
	w.Flush()
}

func inNS(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", namespace}, args...)...).CombinedOutput()
}

func TestCluster(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the end-to-end suite needs root")
	}
	img, _ := filepath.Abs(*imageDir)
	orr, _ := filepath.Abs(*orrery)
	kc, _ := filepath.Abs(*kubectl)
	dir := t.TempDir()
	out := filepath.Join(dir, "owner")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	p := &phases{start: time.Now(), last: time.Now()}
	defer p.print()

	c, err := cloud.Up(ctx, cloud.Spec{
		Dir: dir, ControlPlanes: 1, Workers: 1, CPUs: 2, MemoryMiB: 3072, StateDiskMiB: 8192,
		Image: filepath.Join(img, "disk.qcow2"), Namespace: namespace, KeepLogs: true,
	})
	if err != nil {
		t.Fatalf("orrery mini up: %v", err)
	}
	defer func() {
		if t.Failed() {
			for _, n := range c.Nodes() {
				raw, _ := os.ReadFile(n.SerialLog())
				lines := strings.Split(string(raw), "\n")
				if len(lines) > 60 {
					lines = lines[len(lines)-60:]
				}
				t.Logf("console of %s:\n%s", n.Name, strings.Join(lines, "\n"))
			}
		}
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("down: %v", err)
		}
		p.done("mini down")
	}()
	p.done("mini up")

	initOut, err := inNS(ctx, orr, "init", "--mini-dir", dir, "--out-dir", out,
		"--measurements", filepath.Join(img, "measurements.json"), "--timeout", "30m")
	t.Logf("orrery init:\n%s", initOut)
	if err != nil {
		t.Fatalf("orrery init: %v", err)
	}
	p.done("orrery init (incl. boot, kubeadm, services)")

	k := func(args ...string) (string, error) {
		b, err := inNS(ctx, append([]string{kc, "--kubeconfig", filepath.Join(out, "orrery-admin.conf")}, args...)...)
		return string(b), err
	}
	waitFor := func(what string, timeout time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !ok() {
			if time.Now().After(deadline) {
				nodes, _ := k("get", "nodes", "-o", "wide")
				pods, _ := k("get", "pods", "-A", "-o", "wide")
				t.Fatalf("%s: not within %s\n%s\n%s", what, timeout, nodes, pods)
			}
			time.Sleep(5 * time.Second)
		}
		p.done(what)
	}
	waitFor("worker joins and both nodes are Ready", 15*time.Minute, func() bool {
		s, err := k("get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}")
		return err == nil && strings.Contains(s, "cp-0=True") && strings.Contains(s, "worker-0=True")
	})
	for _, sel := range []string{"app=orrery-joinservice", "app=flannel", "k8s-app=kube-dns"} {
		if s, err := k("-n", "kube-system", "wait", "--for=condition=Ready", "pod", "-l", sel, "--timeout=10m"); err != nil {
			t.Fatalf("pods %s not ready: %v\n%s", sel, err, s)
		}
	}
	p.done("join service, key service, CNI and CoreDNS ready")

	manifest := `apiVersion: v1
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
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := k("apply", "-f", filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatalf("apply: %v\n%s", err, s)
	}
	if s, err := k("wait", "--for=condition=Ready", "pod/web", "--timeout=10m"); err != nil {
		t.Fatalf("web pod: %v\n%s", err, s)
	}
	// Debian's static busybox crashes in wget (glibc NSS); nc works.
	client := `apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
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
      busybox nslookup web.default.svc.cluster.local 10.96.0.10 || exit 1
      for i in $(busybox seq 1 20); do
        printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 3 $WEB_SERVICE_HOST 80 && exit 0
        sleep 3
      done
      exit 1
`
	os.WriteFile(filepath.Join(dir, "client.yaml"), []byte(client), 0o644)
	if s, err := k("apply", "-f", filepath.Join(dir, "client.yaml")); err != nil {
		t.Fatalf("apply: %v\n%s", err, s)
	}
	waitFor("a pod on the worker reaches a Service on the control plane", 10*time.Minute, func() bool {
		s, _ := k("get", "pod", "client", "-o", "jsonpath={.status.phase}")
		return s == "Succeeded" || s == "Failed"
	})
	logs, _ := k("logs", "client")
	if !strings.Contains(logs, "hello-from-cp-0") || !strings.Contains(logs, "Address") {
		t.Fatalf("client on worker-0 did not get the page through the Service (or DNS failed):\n%s", logs)
	}

	for _, n := range c.Nodes() {
		raw, _ := os.ReadFile(n.SerialLog())
		want := "node bootstrapped"
		if n.Role == cloud.Worker {
			want = "joined the cluster"
		}
		for _, phase := range []string{"waiting for init or join", want} {
			if !strings.Contains(string(raw), phase) {
				t.Errorf("bootstrapperd's journal on %s lacks %q", n.Name, phase)
			}
		}
	}
	p.done("checks")
}
