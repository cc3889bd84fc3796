package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/clustersettings"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
	"github.com/orrery-dev/orrery/internal/versions"
)

// manifestsDir is where kubelet reads a control plane's static pods.
const manifestsDir = "/etc/kubernetes/manifests"

// rewriteStaticPods makes a control plane's static pods, kept on its state
// disk, what kubeadm writes for this cluster, before kubelet runs them
// ('bootstrapperd static-pods', which orrery-static-pods.service runs
// ahead of kubelet on every start of it). The initrd's check of the kept
// files reads only their containers, commands and images: a flag, a host
// mount or a privilege that root on the control plane added would
// otherwise run on every boot.
//
// The settings the pods are made from come from the kept pods themselves
// and are held to what an owner may ask of an init, and the node name to
// the one the platform certified: what root could still change there
// breaks the control plane and gives it nothing (see
// kubeadm.KeptSettings). A pod that does not say what made it stops
// kubelet from starting, since nothing it would run could be trusted.
func rewriteStaticPods(ctx context.Context, dir string, tool *kubeadm.Tool, openTPM tpmdev.Opener, out io.Writer) error {
	p, err := kubeadm.KeptSettings(dir)
	if err != nil {
		return fmt.Errorf("%w; kubelet does not start on this control plane: remove the node from the cluster ('orrery node remove') and create another", err)
	}
	s := clustersettings.Settings{KubernetesVersion: p.KubernetesVersion, ClusterName: p.ClusterName, ServiceCIDR: p.ServiceCIDR}
	if err := s.Validate(versions.Supported); err != nil {
		return fmt.Errorf("the control plane's kept static pods ask for what an init may not: %w; kubelet does not start on this control plane", err)
	}
	if err := checkCertifiedName(p.NodeName, openTPM); err != nil {
		return err
	}
	pods, err := tool.StaticPods(ctx, p, out)
	if err != nil {
		return fmt.Errorf("make the control plane's static pods: %w", err)
	}
	rewrote, err := kubeadm.RewriteStaticPods(dir, pods)
	if err != nil {
		return err
	}
	if len(rewrote) > 0 {
		fmt.Fprintf(out, "rewrote the static pods %s in %s: they were not what kubeadm writes for this cluster (root on this node may have changed them)\n", strings.Join(rewrote, ", "), dir)
		return nil
	}
	fmt.Fprintf(out, "the static pods in %s are what kubeadm writes for this cluster\n", dir)
	return nil
}

// checkCertifiedName refuses static pods made for another node than the
// one the platform certified in this node's attestation key certificate.
// A node without a certified instance has no name to hold them to, and
// pods without etcd's name none to be held: a control plane that joins
// another starts kubelet before kubeadm writes its etcd pod, and until
// then its pods name no node (KeptSettings).
func checkCertifiedName(name string, openTPM tpmdev.Opener) error {
	if name == "" {
		return nil
	}
	rw, err := openTPM()
	if err != nil {
		return fmt.Errorf("open the TPM to read this node's certified name: %w", err)
	}
	defer rw.Close()
	inst, err := qemu.ReadInstance(rw)
	if err != nil || inst.IsZero() {
		return nil
	}
	if inst.Name != name {
		return fmt.Errorf("the control plane's kept static pods are made for node %q, but this node's attestation key certificate names it %s; kubelet does not start on this control plane", name, inst)
	}
	return nil
}
