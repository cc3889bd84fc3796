//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/tarfiles"
)

// stopKubeletPod runs on the control plane as root in the host's
// namespaces: it prints the first line of the cluster's CA keys' bodies
// (for the suite to look for in the support bundle, never to log), then
// stops kubelet for a while, as a failure the owner must see through.
func stopKubeletPod(node string) string {
	script := `for f in ca.key etcd/ca.key front-proxy-ca.key sa.key; do echo KEY $(sed -n 2p /etc/kubernetes/pki/$f); done; echo keys-done; sleep 15; systemctl stop kubelet; sleep 100; systemctl start kubelet`
	return `apiVersion: v1
kind: Pod
metadata: {name: stop-kubelet, namespace: default}
spec:
  nodeName: ` + node + `
  restartPolicy: Never
  hostPID: true
  tolerations: [{operator: Exists}]
  containers:
  - name: c
    image: ghcr.io/flannel-io/flannel:v0.28.4
    imagePullPolicy: Never
    securityContext: {privileged: true}
    command: ["/usr/bin/busybox", "nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--", "/bin/sh", "-c", "` + script + `"]
`
}

// inspectRunningNodes: the owner verifies every running node, and reads
// the control plane's and the worker's journal and units while the
// control plane's kubelet is stopped; a caller without the owner's key
// is refused; a support bundle holds each node's journal and no secret.
func inspectRunningNodes(t *testing.T, ctx context.Context, k kubectlFunc, dir, out, img, orr string, p *phases) {
	t.Helper()
	owner := append([]string{"--master-secret", filepath.Join(out, workspace.MasterSecretFile), "--kubeconfig", filepath.Join(out, workspace.KubeconfigFile), "--mini-dir", dir}, ownerChecks(img, dir)...)
	// The owner's flags come first, so a test's own flag overrides one
	// (a string flag given twice takes the last).
	orrery := func(args ...string) (string, error) {
		cmd := append([]string{orr, args[0]}, owner...)
		b, err := inNS(ctx, append(cmd, args[1:]...)...)
		return string(b), err
	}

	p.doing("orrery verify checks every running node")
	s, err := orrery("verify")
	t.Logf("orrery verify:\n%s", s)
	if err != nil || strings.Count(s, "): OK") != 2 || !strings.Contains(s, "cluster ID:") || !strings.Contains(s, "attestation:  gcp-sev-snp") {
		t.Fatalf("orrery verify of the running cluster: %v\n%s", err, s)
	}
	p.done("orrery verify checks every running node")

	p.doing("with cp-0's kubelet stopped, orrery logs and services read both nodes")
	logs := runPod(t, k, dir, "stop-kubelet", stopKubeletPod("cp-0"), "keys-done")
	var caKeys []string
	for _, l := range strings.Split(logs, "\n") {
		if key, ok := strings.CutPrefix(l, "KEY "); ok && len(key) > 40 {
			caKeys = append(caKeys, key[:40])
		}
	}
	if len(caKeys) != 4 {
		t.Fatalf("read %d of the control plane's 4 CA keys", len(caKeys))
	}
	deadline := waitDeadline(t, patience(2*time.Minute))
	for {
		s, err = orrery("services", "cp-0", "kubelet.service", "-o", "json")
		if err == nil && strings.Contains(s, `"active": "inactive"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cp-0's kubelet did not show as stopped: %v\n%s", err, s)
		}
		time.Sleep(3 * time.Second)
	}
	s, _ = orrery("services", "cp-0", "kube*")
	t.Logf("orrery services cp-0 'kube*' (kubelet stopped):\n%s", s)
	s, err = orrery("logs", "cp-0", "kubelet", "-n", "20")
	t.Logf("orrery logs cp-0 kubelet (kubelet stopped):\n%s", lastLines(s, 6))
	if err != nil || !strings.Contains(s, "Stopped kubelet") {
		t.Errorf("cp-0's kubelet journal while it is stopped: %v\n%s", err, lastLines(s, 10))
	}
	// Without an API server to list the nodes, 'orrery mini''s state
	// names them.
	// (The last --kubeconfig counts.)
	s, err = orrery("services", "worker-0", "containerd*", "--kubeconfig", filepath.Join(dir, "no.conf"))
	if err != nil || !strings.Contains(s, "containerd.service") || !strings.Contains(s, "running") {
		t.Errorf("worker-0's units by 'orrery mini''s state: %v\n%s", err, s)
	}
	if s, err = orrery("logs", "worker-0", "bootstrapperd"); err != nil || !strings.Contains(s, "joined the cluster") {
		t.Errorf("worker-0's bootstrapperd journal: %v\n%s", err, lastLines(s, 10))
	}
	if s, err = orrery("dmesg", "worker-0", "-n", "5"); err != nil || strings.Count(s, "\n") < 5 {
		t.Errorf("worker-0's kernel log: %v\n%s", err, s)
	}
	p.done("with cp-0's kubelet stopped, orrery logs and services read both nodes")

	p.doing("a caller without the owner's key is refused; the support bundle holds no secret")
	intruder := filepath.Join(dir, "intruder-owner")
	os.MkdirAll(intruder, 0o700)
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys.WriteMasterSecretFile(filepath.Join(intruder, workspace.MasterSecretFile), ms)
	state, _ := os.ReadFile(filepath.Join(out, workspace.StateFile))
	os.WriteFile(filepath.Join(intruder, workspace.StateFile), state, 0o600)
	s, err = orrery("logs", "cp-0", "--master-secret", filepath.Join(intruder, workspace.MasterSecretFile))
	if err == nil || !strings.Contains(s, "answers only its owner") {
		t.Errorf("logs with another master secret: %v\n%s", err, s)
	}

	bundle := filepath.Join(dir, "support.tar.gz")
	s, err = orrery("support", "--file", bundle)
	t.Logf("orrery support:\n%s", s)
	if err != nil {
		t.Fatalf("orrery support: %v", err)
	}
	f, err := os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, err := tarfiles.Read(f)
	if err != nil {
		t.Fatalf("orrery support's bundle: %v", err)
	}
	for _, n := range []string{"cp-0", "worker-0"} {
		if !strings.Contains(files["nodes/"+n+"/journal.log"], "bootstrapperd") || files["nodes/"+n+"/units.txt"] == "" {
			t.Errorf("the bundle lacks %s's journal or units: it has %s", n, tarfiles.Names(files))
		}
	}
	secret := readMasterSecret(t, filepath.Join(out, workspace.MasterSecretFile))
	for name, content := range files {
		for i, needle := range append(caKeys, secret...) {
			if strings.Contains(content, needle) {
				t.Errorf("the support bundle's %s holds secret #%d (master secret or a CA key)", name, i)
			}
		}
	}
	p.done("a caller without the owner's key is refused; the support bundle holds no secret")
	// cp-0's kubelet is back once the pod's sleep ends.
	waitFor := waitDeadline(t, patience(5*time.Minute))
	for {
		s, _ := k("get", "node", "cp-0", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if s == "True" {
			if s, err := orrery("services", "cp-0", "kubelet.service", "-o", "json"); err == nil && strings.Contains(s, `"active": "active"`) {
				break
			}
		}
		if time.Now().After(waitFor) {
			t.Fatalf("cp-0's kubelet did not come back")
		}
		time.Sleep(5 * time.Second)
	}
	k("delete", "pod", "stop-kubelet", "--wait=false")
	p.done("cp-0's kubelet back")
}

// readMasterSecret returns the master secret's key and salt as a leak
// would show them: in hex and in base64.
func readMasterSecret(t *testing.T, path string) []string {
	t.Helper()
	ms, err := keys.ReadMasterSecretFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, b := range [][]byte{ms.Key, ms.Salt} {
		out = append(out, hex.EncodeToString(b), base64.StdEncoding.EncodeToString(b)[:40])
	}
	return out
}
