// Package kubeadmtest makes what real kubeadm makes on a node, for tests
// of what reads it.
package kubeadmtest

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// NodeIP is the address of the control plane KeptPods makes.
var NodeIP = netip.MustParseAddr("10.42.1.100")

// KeptPods is a folder of the static pods real kubeadm writes for control
// plane cp-0 of a cluster at version. It skips the test when kubeadm is
// not built.
func KeptPods(tb testing.TB, version string) string {
	tb.Helper()
	return keptPods(tb, version, true)
}

// KeptPodsWithClusterCA is KeptPods of a cluster made before the
// kubelet-serving CA: its API server checks kubelets against the cluster
// CA, and its controller manager signs their serving certificates with it.
func KeptPodsWithClusterCA(tb testing.TB, version string) string {
	tb.Helper()
	return keptPods(tb, version, false)
}

func keptPods(tb testing.TB, version string, servingCA bool) string {
	tb.Helper()
	bin := apiservertest.Kubeadm(tb)
	// tb.Setenv is testing.T's alone; kubeadm is found on PATH.
	old := os.Getenv("PATH")
	if err := os.Setenv("PATH", filepath.Dir(bin)+string(os.PathListSeparator)+old); err != nil {
		tb.Fatal(err)
	}
	defer os.Setenv("PATH", old)
	tool := &kubeadm.Tool{Runner: kubeadm.ExecRunner{}, ConfigDir: tb.TempDir()}
	pods, err := tool.StaticPods(context.Background(), kubeadm.InitParams{NodeName: "cp-0", NodeIP: NodeIP, KubeletServingCA: servingCA,
		KubernetesVersion: version, ClusterName: "orrery", ServiceCIDR: clusternet.DefaultServiceCIDR}, &bytes.Buffer{})
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	for name, b := range pods {
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}
