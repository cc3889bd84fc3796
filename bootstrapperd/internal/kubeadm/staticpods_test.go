package kubeadm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/versions"
)

// staticPodTool runs the real kubeadm (build/components) for StaticPods.
func staticPodTool(t *testing.T) *Tool {
	t.Helper()
	bin := apiservertest.Kubeadm(t)
	t.Setenv("PATH", filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	return &Tool{Runner: ExecRunner{}, ConfigDir: t.TempDir()}
}

var cp0 = InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100"),
	KubernetesVersion: versions.Default, ClusterName: "orrery", ServiceCIDR: clusternet.DefaultServiceCIDR}

func writePods(t *testing.T, dir string, pods map[string][]byte) {
	t.Helper()
	for name, b := range pods {
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// A control plane's static pods are made anew from what kubeadm writes
// for the settings they were made with: a flag or a mount that root on
// the control plane added is gone. A pod it removed stays removed.
func TestStaticPodsAreRewrittenWhole(t *testing.T) {
	tool := staticPodTool(t)
	var out bytes.Buffer
	want := cp0StaticPods(t, tool, &out)

	kept := t.TempDir()
	writePods(t, kept, want)
	p, err := KeptSettings(kept)
	if err != nil {
		t.Fatalf("KeptSettings of kubeadm's own pods: %v", err)
	}
	if p.NodeName != cp0.NodeName || p.NodeIP != cp0.NodeIP || p.KubernetesVersion != cp0.KubernetesVersion ||
		p.ClusterName != cp0.ClusterName || p.ServiceCIDR != cp0.ServiceCIDR {
		t.Fatalf("KeptSettings = %+v, want %+v", p, cp0)
	}
	if rewrote, err := RewriteStaticPods(kept, want); err != nil || len(rewrote) != 0 {
		t.Fatalf("RewriteStaticPods of unchanged pods: rewrote %v, %v", rewrote, err)
	}

	planted := map[string][]byte{
		"kube-apiserver": bytes.Replace(want["kube-apiserver"], []byte("--authorization-mode=Node,RBAC"), []byte("--authorization-mode=AlwaysAllow"), 1),
		"etcd": bytes.Replace(want["etcd"], []byte("  volumes:\n"),
			[]byte("  volumes:\n  - hostPath:\n      path: /\n    name: host\n"), 1),
	}
	for name, b := range planted {
		if bytes.Equal(b, want[name]) {
			t.Fatalf("the test's change to %s changed nothing", name)
		}
	}
	writePods(t, kept, planted)
	if err := os.Remove(filepath.Join(kept, "kube-scheduler.yaml")); err != nil {
		t.Fatal(err)
	}
	p, err = KeptSettings(kept)
	if err != nil {
		t.Fatalf("KeptSettings: %v", err)
	}
	again, err := tool.StaticPods(context.Background(), p, &out)
	if err != nil {
		t.Fatalf("StaticPods: %v", err)
	}
	rewrote, err := RewriteStaticPods(kept, again)
	if err != nil || !slices.Equal(rewrote, []string{"etcd", "kube-apiserver"}) {
		t.Fatalf("RewriteStaticPods rewrote %v, %v; want etcd, kube-apiserver", rewrote, err)
	}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		b, err := os.ReadFile(filepath.Join(kept, name+".yaml"))
		if err != nil || !bytes.Equal(b, want[name]) {
			t.Errorf("%s after the rewrite is not kubeadm's (%v)", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(kept, "kube-scheduler.yaml")); err == nil {
		t.Error("RewriteStaticPods wrote a pod that was not there")
	}

	checkRewriteWithoutEtcdPod(t, tool, kept, planted, &out)
}

// cp0StaticPods are the static pods kubeadm writes for cp0, with Orrery's
// configuration and patches.
func cp0StaticPods(t *testing.T, tool *Tool, out *bytes.Buffer) map[string][]byte {
	t.Helper()
	want, err := tool.StaticPods(context.Background(), cp0, out)
	if err != nil {
		t.Fatalf("StaticPods: %v\n%s", err, out.String())
	}
	if !bytes.Contains(want["kube-apiserver"], []byte("--advertise-address=10.42.1.100")) ||
		!bytes.Contains(want["etcd"], []byte("--heartbeat-interval="+etcdHeartbeatMillis)) ||
		!bytes.Contains(want["etcd"], []byte("--watch-progress-notify-interval="+etcdProgressNotifyInterval)) ||
		bytes.Count(want["etcd"], []byte("--watch-progress-notify-interval=")) != 1 ||
		!bytes.Contains(want["kube-apiserver"], []byte(apiServerLivenessPath)) {
		t.Fatalf("kubeadm's static pods lack Orrery's configuration or its patches:\n%s\n%s", want["kube-apiserver"], want["etcd"])
	}
	if entries, _ := os.ReadDir(tool.ConfigDir); slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), "static-pods-") }) {
		t.Errorf("StaticPods left its directory behind: %v", entries)
	}
	return want
}

// A control plane's kubeadm join starts kubelet before it writes
// etcd's pod: the others are still checked, and no etcd is made.
func checkRewriteWithoutEtcdPod(t *testing.T, tool *Tool, kept string, planted map[string][]byte, out *bytes.Buffer) {
	t.Helper()
	os.Remove(filepath.Join(kept, "etcd.yaml"))
	writePods(t, kept, planted)
	os.Remove(filepath.Join(kept, "etcd.yaml"))
	p, err := KeptSettings(kept)
	if err != nil || p.NodeName != "" {
		t.Fatalf("KeptSettings without etcd's pod: %+v, %v", p, err)
	}
	again, err := tool.StaticPods(context.Background(), p, out)
	if err != nil {
		t.Fatalf("StaticPods without a node name: %v", err)
	}
	rewrote, err := RewriteStaticPods(kept, again)
	if err != nil || !slices.Equal(rewrote, []string{"kube-apiserver"}) {
		t.Fatalf("RewriteStaticPods without etcd's pod rewrote %v, %v; want kube-apiserver", rewrote, err)
	}
	if _, err := os.Stat(filepath.Join(kept, "etcd.yaml")); err == nil {
		t.Error("RewriteStaticPods made an etcd pod for a control plane whose join had not written one")
	}
}

// Kept static pods that do not say what made them are refused, and
// nothing is written.
func TestKeptSettingsRefusesWhatKubeadmDoesNotWrite(t *testing.T) {
	tool := staticPodTool(t)
	want, err := tool.StaticPods(context.Background(), cp0, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		pod    string
		change func([]byte) []byte
		says   string
	}{
		"an image from elsewhere": {"kube-apiserver", func(b []byte) []byte {
			return bytes.Replace(b, []byte("image: registry.k8s.io/kube-apiserver:"), []byte("image: evil.example/kube-apiserver:"), 1)
		}, `runs image "evil.example/kube-apiserver:`},
		"two addresses": {"kube-apiserver", func(b []byte) []byte {
			return bytes.Replace(b, []byte("    - --advertise-address=10.42.1.100\n"), []byte("    - --advertise-address=10.42.1.100\n    - --advertise-address=10.0.0.1\n"), 1)
		}, "no single --advertise-address"},
		"no cluster name": {"kube-controller-manager", func(b []byte) []byte {
			return bytes.Replace(b, []byte("--cluster-name="), []byte("--cluster-nam="), 1)
		}, "no single --cluster-name"},
		"a bad node name": {"etcd", func(b []byte) []byte { return bytes.Replace(b, []byte("--name=cp-0"), []byte("--name=CP_0"), 1) }, "not a node name"},
		"a bad address": {"kube-apiserver", func(b []byte) []byte {
			return bytes.Replace(b, []byte("--advertise-address=10.42.1.100"), []byte("--advertise-address=nowhere"), 1)
		}, "not an IP address"},
		"another container": {"etcd", func(b []byte) []byte { return bytes.Replace(b, []byte("name: etcd\n"), []byte("name: shell\n"), -1) }, "does not run one container etcd"},
		"garbage":           {"kube-controller-manager", func([]byte) []byte { return []byte("\x00\x01{[") }, "is not a pod"},
		"missing":           {"kube-apiserver", nil, "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			kept := t.TempDir()
			writePods(t, kept, want)
			path := filepath.Join(kept, tc.pod+".yaml")
			if tc.change == nil {
				os.Remove(path)
			} else if err := os.WriteFile(path, tc.change(want[tc.pod]), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := KeptSettings(kept)
			if !errors.Is(err, ErrKeptSettings) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("KeptSettings: %v; want ErrKeptSettings saying %q", err, tc.says)
			}
		})
	}
}
