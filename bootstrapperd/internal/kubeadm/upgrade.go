package kubeadm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// UpgradeParams are the inputs of `kubeadm upgrade apply` and `kubeadm
// upgrade node`.
type UpgradeParams struct {
	// KubernetesVersion is the version to upgrade to.
	KubernetesVersion string
	// Kubeadm is that version's kubeadm: kubeadm upgrades to its own
	// version, never to a newer one.
	Kubeadm string
	// Apply runs `kubeadm upgrade apply`, which moves the cluster's
	// configuration and add-ons and this control plane; otherwise
	// `kubeadm upgrade node`.
	Apply bool
	// ControlPlane gives kubeadm the control plane's patches, so the
	// static pods it writes are what init and join wrote (and what
	// orrery-static-pods checks at boot).
	ControlPlane bool
	// Endpoint is the control-plane endpoint, HOST:PORT, that the CoreDNS
	// patch points at (Apply only).
	Endpoint string
	// PatchDir: see InitParams; Upgrade sets it.
	PatchDir string
}

type upgradeConfiguration struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Apply      upgradeApply `json:"apply"`
	Node       upgradeNode  `json:"node"`
	Timeouts   upgradeWaits `json:"timeouts"`
}

type upgradeApply struct {
	KubernetesVersion     string   `json:"kubernetesVersion"`
	ImagePullPolicy       string   `json:"imagePullPolicy"`
	Patches               *patches `json:"patches,omitempty"`
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
}

// skippedApplyChecks are kubeadm upgrade apply's preflight checks that
// Orrery leaves out. CreateJob runs a Job whose pod must finish within a
// fixed 60 s: on a control plane of 2 TCG vCPUs (on 2 host cores) its pod
// started 49 s after it was created and had not been seen to exit when
// the Job's deadline (65 s) ended it, so the upgrade stopped before it
// began. What the check asks, that the cluster schedules and runs pods,
// the owner's orrery checks before it asks for the upgrade (every node
// Ready), and kubeadm's other checks (the control planes Ready, their
// static pods) still run.
var skippedApplyChecks = []string{"CreateJob"}

type upgradeNode struct {
	ImagePullPolicy string   `json:"imagePullPolicy"`
	Patches         *patches `json:"patches,omitempty"`
}

type upgradeWaits struct {
	timeouts
	// UpgradeManifests is how long kubeadm waits for each upgraded
	// static pod to run (default 5 min): as long as init waits for one
	// to start.
	UpgradeManifests string `json:"upgradeManifests"`
}

// UpgradeConfig renders the configuration file for `kubeadm upgrade apply
// --config` and `kubeadm upgrade node --config`.
func UpgradeConfig(p UpgradeParams) ([]byte, error) {
	if p.KubernetesVersion == "" {
		return nil, fmt.Errorf("kubeadm upgrade config: the version is required")
	}
	c := upgradeConfiguration{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "UpgradeConfiguration",
		Apply: upgradeApply{KubernetesVersion: p.KubernetesVersion, ImagePullPolicy: "Never", Patches: patchesIn(p.PatchDir),
			IgnorePreflightErrors: skippedApplyChecks},
		Node:     upgradeNode{ImagePullPolicy: "Never", Patches: patchesIn(p.PatchDir)},
		Timeouts: upgradeWaits{timeouts: slowTimeouts, UpgradeManifests: controlPlaneHealthCheck},
	}
	return documents(c)
}

// Upgrade runs kubeadm's upgrade of this node to p.KubernetesVersion.
// kubeadm restores a control plane's static pods itself when one does not
// come up; kubelet is left to the caller.
func (t *Tool) Upgrade(ctx context.Context, p UpgradeParams, out io.Writer) error {
	if !p.ControlPlane {
		// kubeadm upgrade node writes the kubelet configuration again
		// from the cluster's.
		p.PatchDir = filepath.Join(t.ConfigDir, "kubeadm-upgrade-patches")
		if err := writePatchFiles(p.PatchDir, workerKubeletPatch); err != nil {
			return err
		}
		defer os.RemoveAll(p.PatchDir)
	}
	if p.ControlPlane {
		p.PatchDir = filepath.Join(t.ConfigDir, "kubeadm-upgrade-patches")
		var extra map[string]string
		if p.Apply {
			patch, err := coreDNSPatch(p.Endpoint)
			if err != nil {
				return fmt.Errorf("kubeadm upgrade apply: %w", err)
			}
			extra = map[string]string{coreDNSPatchFile: patch}
		}
		if err := writePatches(p.PatchDir, extra); err != nil {
			return err
		}
		defer os.RemoveAll(p.PatchDir)
	}
	cfg, err := UpgradeConfig(p)
	if err != nil {
		return err
	}
	path, err := t.writeConfig("kubeadm-upgrade.yaml", cfg)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	args := []string{"upgrade", "node", "--config", path}
	if p.Apply {
		args = []string{"upgrade", "apply", "--config", path, "--yes"}
	}
	return t.Runner.Run(ctx, p.Kubeadm, args, nil, out)
}
