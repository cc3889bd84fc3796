package cmd

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/apiservertest"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/nodepb"
)

// TestNamedNodeMustProveItIsThatNode is root on worker-0 rewriting its
// Node's address (its kubelet's credential may) to worker-1's, a genuine
// node of the same image and cluster. The owner's commands look worker-0
// up in a real API server and dial what it lists: each must refuse the
// node that answers, since its attestation names worker-1, and say so.
// The nodes serve on the node service's own port, on loopback addresses
// of their own, as the commands dial them.
func TestNamedNodeMustProveItIsThatNode(t *testing.T) {
	srv := apiservertest.Start(t)
	c := newOwnersCluster(t, t.TempDir())
	ip1 := "127.0.52.2"
	c.serveNode(t, "worker-1", net.JoinHostPort(ip1, fmt.Sprint(nodepb.Port)))
	client, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, ip := range map[string]string{"worker-0": ip1, "worker-1": ip1} {
		n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	owner := append(c.ownerArgs(t), "--kubeconfig", srv.Kubeconfig)
	cmd := func(args ...string) (string, string, int) { return run(t, "", append(args, owner...)...) }

	out, errOut, code := cmd("verify", "worker-1")
	if code != 0 || !strings.Contains(out, "worker-1 ("+ip1) || !strings.Contains(out, "): OK") {
		t.Fatalf("verify worker-1 at its own address: exit %d\n%s%s", code, out, errOut)
	}

	out, errOut, code = cmd("verify", "worker-0")
	if code == 0 || !strings.Contains(out, "worker-0 ("+ip1) || !strings.Contains(out, "REFUSED") || !strings.Contains(out, "is worker-1 (instance ID") {
		t.Errorf("verify worker-0 at worker-1's address: exit %d, want a refusal naming worker-1\n%s%s", code, out, errOut)
	}
	// Every node of the cluster: worker-0's verdict is the refusal.
	out, errOut, code = cmd("verify")
	if code == 0 || strings.Count(out, "): OK") != 1 || !strings.Contains(out, "is worker-1 (instance ID") {
		t.Errorf("verify of every node: exit %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"logs", "worker-0", "kubelet"}, {"dmesg", "worker-0"}, {"services", "worker-0"}} {
		out, errOut, code := cmd(args...)
		if code == 0 || strings.Contains(out, "kubelet stopped on worker-1") || !strings.Contains(errOut, "is worker-1 (instance ID") {
			t.Errorf("%s: exit %d, want a refusal naming worker-1 and nothing of worker-1's\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	// Named by address, the node is shown as the instance it proved.
	out, errOut, code = cmd("verify", ip1)
	if code != 0 || !strings.Contains(out, "worker-1 ("+ip1) {
		t.Errorf("verify %s: exit %d, want worker-1's verdict\n%s%s", ip1, code, out, errOut)
	}
}

// TestNoTestRootIsTakenUnnamed: a test root in the local cloud's
// directory (which whoever can write the working directory can plant) is
// not taken by a command left to its defaults; the command says which
// flag names it.
func TestNoTestRootIsTakenUnnamed(t *testing.T) {
	c := newOwnersCluster(t, t.TempDir())
	mini := filepath.Join(c.dir, "orrery-mini")
	if err := os.MkdirAll(mini, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mini, snpTestRootFile), []byte(`{"notARealCpu": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"verify", "127.0.0.1"}, {"logs", "127.0.0.1"}, {"support", "127.0.0.1"}} {
		_, errOut, code := run(t, "", append(args, "--master-secret", filepath.Join(c.dir, workspace.MasterSecretFile),
			"--mini-dir", mini, "--platform-ca", c.caFile, "--timeout", "5s")...)
		if code == 0 || !strings.Contains(errOut, "--snp-test-root "+filepath.Join(mini, snpTestRootFile)) {
			t.Errorf("%s with a test root in the mini dir, unnamed: exit %d, want the flag named\n%s", args[0], code, errOut)
		}
	}
}
