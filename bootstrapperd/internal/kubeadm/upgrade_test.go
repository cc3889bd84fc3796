package kubeadm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestUpgradeRunsTheTargetsKubeadmWithThePatches(t *testing.T) {
	for _, c := range []struct {
		name             string
		p                UpgradeParams
		wantArgs         string
		wantPatches      bool
		wantCoreDNSPatch bool
	}{
		{"first control plane", UpgradeParams{Apply: true, ControlPlane: true, Endpoint: "10.42.0.2:6443"}, "upgrade apply --config CONFIG --yes", true, true},
		{"other control plane", UpgradeParams{ControlPlane: true}, "upgrade node --config CONFIG", true, false},
		{"worker", UpgradeParams{}, "upgrade node --config CONFIG", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.p.KubernetesVersion, c.p.Kubeadm = "v1.37.2", "/usr/lib/orrery/kubernetes/v1.37.2/kubeadm"
			var cfg []byte
			var patches []string
			r := &fakeRunner{onRun: func(cl call) error {
				i := slices.Index(cl.args, "--config")
				cfg, _ = os.ReadFile(cl.args[i+1])
				cl.args[i+1] = "CONFIG"
				if d := get(splitDocs(t, cfg)[0], "apply", "patches", "directory"); d != nil {
					entries, _ := os.ReadDir(d.(string))
					for _, e := range entries {
						patches = append(patches, e.Name())
					}
				}
				return nil
			}}
			tool := &Tool{Runner: r, ConfigDir: filepath.Join(dir, "run")}
			if err := tool.Upgrade(context.Background(), c.p, &bytes.Buffer{}); err != nil {
				t.Fatal(err)
			}
			if len(r.calls) != 1 || r.calls[0].name != c.p.Kubeadm || strings.Join(r.calls[0].args, " ") != c.wantArgs {
				t.Fatalf("ran %+v, want %s %s", r.calls, c.p.Kubeadm, c.wantArgs)
			}
			doc := splitDocs(t, cfg)[0]
			if get(doc, "kind") != "UpgradeConfiguration" || get(doc, "apply", "kubernetesVersion") != "v1.37.2" ||
				get(doc, "apply", "imagePullPolicy") != "Never" || get(doc, "node", "imagePullPolicy") != "Never" {
				t.Errorf("configuration:\n%s", cfg)
			}
			if got := fmt.Sprint(get(doc, "apply", "ignorePreflightErrors")); got != "[CreateJob]" {
				t.Errorf("apply.ignorePreflightErrors = %s, want [CreateJob] alone", got)
			}
			if got := get(doc, "timeouts", "upgradeManifests"); got != controlPlaneHealthCheck {
				t.Errorf("timeouts.upgradeManifests = %v, want %s", got, controlPlaneHealthCheck)
			}
			if slices.Contains(patches, "kube-apiserver+strategic.yaml") != c.wantPatches || slices.Contains(patches, coreDNSPatchFile) != c.wantCoreDNSPatch ||
				slices.Contains(patches, "kubeletconfiguration+merge.yaml") == c.wantPatches {
				t.Errorf("patches %v; want control-plane patches %v, CoreDNS's %v, a worker's kubelet patch %v", patches, c.wantPatches, c.wantCoreDNSPatch, !c.wantPatches)
			}
			if entries, _ := os.ReadDir(tool.ConfigDir); len(entries) != 0 {
				t.Errorf("left %d files in the configuration directory", len(entries))
			}
		})
	}
}

func TestUpgradeApplyNeedsTheAPIServer(t *testing.T) {
	tool := &Tool{Runner: &fakeRunner{}, ConfigDir: t.TempDir()}
	err := tool.Upgrade(context.Background(), UpgradeParams{KubernetesVersion: "v1.37.2", Kubeadm: "kubeadm", Apply: true, ControlPlane: true}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("kubeadm upgrade apply ran without the API server's address for CoreDNS")
	}
}
