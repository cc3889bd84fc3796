package cmd

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/tarfiles"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// TestNamedNodeMustProveItIsThatNode is root on worker-0 rewriting its
// Node's address (its kubelet's credential may) to worker-1's, a genuine
// node of the same image and cluster. The owner's commands look worker-0
// up in a real API server and dial what it lists: each must refuse the
// node that answers, since its attestation names worker-1, and say so.
// The nodes serve on the inspect service's own port, on loopback addresses
// of their own, as the commands dial them.
func TestNamedNodeMustProveItIsThatNode(t *testing.T) {
	srv := apiservertest.Start(t)
	c := newOwnersCluster(t, t.TempDir())
	ip1 := "127.0.52.2"
	c.serveNode(t, "worker-1", net.JoinHostPort(ip1, fmt.Sprint(inspectpb.Port)))
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

// TestPlantedWorkspaceKubeconfigRunsNothing: a kubeconfig planted in the
// workspace (a checkout, a shared directory) whose user gets credentials
// from a command: client-go would run it as the owner. Found unnamed, it
// is refused before anything runs; so is one that is a link.
func TestPlantedWorkspaceKubeconfigRunsNothing(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	planted := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: ["-c", "touch ` + marker + `"], interactiveMode: Never}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(filepath.Join(dir, workspace.KubeconfigFile), []byte(planted), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", "")
	for _, args := range [][]string{{"status"}, {"control-plane", "list"}, {"upgrade", "check"}} {
		var out, errOut bytes.Buffer
		code := Execute(context.Background(), append(args, "--workspace", dir), &out, &errOut)
		if code == 0 || !strings.Contains(errOut.String(), "runs a command or a plugin for its credentials") {
			t.Errorf("%s with a planted exec kubeconfig: exit %d, %s", strings.Join(args, " "), code, errOut.String())
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the planted kubeconfig's command ran")
	}

	linked := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, workspace.KubeconfigFile), filepath.Join(linked, workspace.KubeconfigFile)); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := Execute(context.Background(), []string{"status", "--workspace", linked}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "not a regular file") {
		t.Errorf("status with a linked workspace kubeconfig: exit %d, %s", code, errOut.String())
	}
}

// TestSupportLeavesOutALinkToTheMasterSecret: a link planted under the
// name of one of the owner's logs, pointing at the master secret, must not
// carry the secret into the bundle the owner sends out.
func TestSupportLeavesOutALinkToTheMasterSecret(t *testing.T) {
	dir := t.TempDir()
	addr, owner := runningNode(t, dir)
	secret := filepath.Join(dir, workspace.MasterSecretFile)
	if err := os.Symlink(secret, filepath.Join(dir, workspace.JournalFile)); err != nil {
		t.Fatal(err)
	}
	// A copy, not a link: the content gives it away.
	raw, err := os.ReadFile(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, workspace.KubeadmLogFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "support.tar.gz")
	var out, errOut bytes.Buffer
	code := Execute(context.Background(), append([]string{"support", addr, "--file", bundle, "--workspace", dir}, owner...), &out, &errOut)
	if code != 0 {
		t.Fatalf("support: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	f, err := os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, err := tarfiles.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := keys.ReadMasterSecretFile(secret)
	for name, content := range files {
		if holdsSecret([]byte(content), ms) {
			t.Errorf("bundle file %s holds the master secret", name)
		}
	}
	if !strings.Contains(errOut.String(), workspace.JournalFile+" left out") || !strings.Contains(errOut.String(), workspace.KubeadmLogFile+" left out: it holds the master secret") {
		t.Errorf("support does not say what it left out:\n%s", errOut.String())
	}
}

// TestPlantedMiniDirGivesNoPlatformCA: an orrery-mini/ planted in the
// working directory (a checkout makes it 0755) with a platform CA of the
// attacker's: verify and recover, given no --platform-ca, must not take it
// as the root of the nodes' attestation keys.
func TestPlantedMiniDirGivesNoPlatformCA(t *testing.T) {
	c := newOwnersCluster(t, t.TempDir())
	mini := filepath.Join(c.dir, "orrery-mini")
	if err := os.MkdirAll(mini, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mini, cloud.StateFile), []byte(`{"phase":"up","nodes":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mini, cloud.PlatformCACert), []byte("planted"), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(c.dir, workspace.MasterSecretFile)
	args := c.ownerArgs(t) // writes measurements.json
	measurements := args[slices.Index(args, "--measurements")+1]
	for _, args := range [][]string{
		{"verify", "127.0.0.1", "--master-secret", secret, "--measurements", measurements},
		{"recover", "--node", "127.0.0.1", "--master-secret", secret},
	} {
		_, errOut, code := run(t, "", append(args, "--mini-dir", mini, "--timeout", "5s")...)
		if code == 0 || !strings.Contains(errOut, "the local cloud's CA is not taken") || !strings.Contains(errOut, "its mode is 0755") {
			t.Errorf("%s with a planted mini dir: exit %d, want a refusal naming its mode\n%s", args[0], code, errOut)
		}
	}
}
