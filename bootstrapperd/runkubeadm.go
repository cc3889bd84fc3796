package main

import (
	"context"
	"fmt"
	"io"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/metadata"
)

// importImages waits until orrery-images.service has linked the baked
// container images into containerd. Its line in out, in kubeadm's
// "[phase]" form, lets the owner's timeline tell this wait from kubeadm's
// own phases.
func importImages(ctx context.Context, tool *kubeadm.Tool, out io.Writer) error {
	fmt.Fprintln(out, "[orrery-images] linking the baked container images into containerd")
	if err := tool.Runner.Run(ctx, "systemctl", []string{"start", "orrery-images.service"}, nil, out); err != nil {
		return fmt.Errorf("import the baked container images: %w", err)
	}
	return nil
}

// chooseRelease points kubeadm, kubelet and kubectl at the image's
// release of version, before kubeadm runs.
func chooseRelease(node kuberelease.Node, version string, out io.Writer) error {
	fmt.Fprintf(out, "[orrery-kubernetes] running Kubernetes %s of this image\n", version)
	if err := node.Activate(version); err != nil {
		return fmt.Errorf("run Kubernetes %s: %w", version, err)
	}
	return nil
}

// joiner runs kubeadm join once the baked images are in containerd.
type joiner struct {
	tool    *kubeadm.Tool
	release kuberelease.Node
}

func (j *joiner) Join(ctx context.Context, p kubeadm.JoinParams, out io.Writer) error {
	if err := chooseRelease(j.release, p.KubernetesVersion, out); err != nil {
		return err
	}
	if err := importImages(ctx, j.tool, out); err != nil {
		return err
	}
	return j.tool.Join(ctx, p, out)
}

func (j *joiner) Reset(ctx context.Context, out io.Writer) error { return j.tool.Reset(ctx, out) }

// cluster runs kubeadm for the init server with this node's certified
// name (the metadata service's only on a node without one) and its address
// from the metadata service.
type cluster struct {
	tool    *kubeadm.Tool
	meta    *metadata.Client
	release kuberelease.Node
}

func (c *cluster) Init(ctx context.Context, p initserver.ClusterParams, out io.Writer) ([]byte, error) {
	self, err := c.meta.Self(ctx)
	if err != nil {
		return nil, fmt.Errorf("ask the metadata service who this node is: %w", err)
	}
	if err := chooseRelease(c.release, p.KubernetesVersion, out); err != nil {
		return nil, err
	}
	// kubeadm finds its images only once they are imported into containerd.
	if err := importImages(ctx, c.tool, out); err != nil {
		return nil, err
	}
	// checkName checked the metadata service's name before the lock; its
	// answer now does not matter where the platform certified one.
	name := self.Name
	if !c.tool.Instance.IsZero() {
		name = c.tool.Instance.Name
	}
	return c.tool.Init(ctx, kubeadm.InitParams{
		NodeName:          name,
		NodeIP:            self.IP,
		KubernetesVersion: p.KubernetesVersion,
		ClusterName:       p.ClusterName,
		ServiceCIDR:       p.ServiceCIDR,
		CertSANs:          p.APIServerSANs,

		ControlPlaneEndpoint: p.ControlPlaneEndpoint,
	}, out)
}

func (c *cluster) Reset(ctx context.Context, out io.Writer) error { return c.tool.Reset(ctx, out) }

func (c *cluster) StoreMasterSecret(ctx context.Context, ms keys.MasterSecret, salt []byte) error {
	return c.tool.StoreMasterSecret(ctx, ms, salt)
}
