package main

import (
	"bytes"
	"context"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/versions"
)

// A control plane whose vTPM certifies it as cp-0 rewrites static pods
// that root changed, and refuses pods made for another node or with
// settings no init may ask for: kubelet then does not start (the unit
// fails). Real kubeadm makes the pods; swtpm holds the certificate.
func TestStaticPodsRewrittenBeforeKubelet(t *testing.T) {
	bin := apiservertest.Kubeadm(t)
	t.Setenv("PATH", filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	node := qemutest.NewInstance(t, ca, platformca.NewInstance("cp-0"))
	tool := &kubeadm.Tool{Runner: kubeadm.ExecRunner{}, ConfigDir: t.TempDir()}
	podsFor := func(name, serviceCIDR string) map[string][]byte {
		pods, err := tool.StaticPods(context.Background(), kubeadm.InitParams{NodeName: name, NodeIP: netip.MustParseAddr("10.42.1.100"),
			KubernetesVersion: versions.Default, ClusterName: "orrery", ServiceCIDR: serviceCIDR}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		return pods
	}
	keep := func(pods map[string][]byte) string {
		dir := t.TempDir()
		for name, b := range pods {
			if err := os.WriteFile(filepath.Join(dir, name+".yaml"), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}

	want := podsFor("cp-0", clusternet.DefaultServiceCIDR)
	planted := maps.Clone(want)
	planted["kube-scheduler"] = bytes.Replace(want["kube-scheduler"], []byte("    - --bind-address=127.0.0.1\n"), []byte("    - --bind-address=0.0.0.0\n"), 1)
	dir := keep(planted)
	var out bytes.Buffer
	if err := rewriteStaticPods(context.Background(), dir, tool, node.TPM.Open, &out); err != nil {
		t.Fatalf("rewriteStaticPods: %v", err)
	}
	if !strings.Contains(out.String(), "rewrote the static pods kube-scheduler in") {
		t.Errorf("rewriteStaticPods said:\n%s\nwant it to name the rewritten kube-scheduler", out.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "kube-scheduler.yaml")); !bytes.Equal(b, want["kube-scheduler"]) {
		t.Errorf("kube-scheduler.yaml is not kubeadm's after the rewrite:\n%s", b)
	}

	// A control plane that joins another starts kubelet before kubeadm
	// writes its etcd pod: without it, its pods name no node, and kubelet
	// must start.
	joining := keep(without(want, "etcd"))
	if err := rewriteStaticPods(context.Background(), joining, tool, node.TPM.Open, &bytes.Buffer{}); err != nil {
		t.Errorf("rewriteStaticPods of a joining control plane's pods, before its etcd pod: %v", err)
	}
	if _, err := os.Stat(filepath.Join(joining, "etcd.yaml")); err == nil {
		t.Error("the rewrite wrote an etcd pod that kubeadm had not written")
	}

	for name, tc := range map[string]struct {
		pods map[string][]byte
		says string
	}{
		"made for another node":           {podsFor("cp-1", clusternet.DefaultServiceCIDR), `made for node "cp-1", but this node's attestation key certificate names it cp-0`},
		"a range no init may ask":         {podsFor("cp-0", "10.244.0.0/20"), "overlaps the pods' range"},
		"no API server to say what it is": {without(want, "kube-apiserver"), "kubelet does not start"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := keep(tc.pods)
			err := rewriteStaticPods(context.Background(), dir, tool, node.TPM.Open, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("rewriteStaticPods: %v; want it refused, saying %q", err, tc.says)
			}
			for pod, b := range tc.pods {
				if have, _ := os.ReadFile(filepath.Join(dir, pod+".yaml")); !bytes.Equal(have, b) {
					t.Errorf("the refused rewrite changed %s", pod)
				}
			}
		})
	}
}

func without(m map[string][]byte, name string) map[string][]byte {
	out := maps.Clone(m)
	delete(out, name)
	return out
}
