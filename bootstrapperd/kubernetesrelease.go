package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
)

// chooseBootRelease points a node that boots into its cluster at the
// image's release of the cluster's Kubernetes version, before kubelet
// (and a control plane's static-pod check, which runs kubeadm) starts
// ('bootstrapperd kubernetes-release', orrery-kubernetes-release.service).
// The version comes from what the node cannot be lied to about:
//   - the join service's rejoin ticket, which the initrd checked and left
//     on /run (handoff.ClusterVersionFile): the version the cluster runs
//     now, whichever the node ran before the reboot;
//   - on a control plane the owner recovered (no ticket), the version its
//     kept API server pod names, which orrery-static-pods then holds to
//     what an init may ask, and kubeadm's own pods replace.
//
// A release bootstrapperd chose this boot, for the kubeadm init or join
// that starts kubelet, stands. Nothing on the state disk chooses one, and
// a node told nothing starts no kubelet.
func chooseBootRelease(node kuberelease.Node, versionFile, manifests string, out io.Writer) error {
	// kubeadm init or join, which bootstrapperd runs with the release it
	// chose this boot (the owner's or the ticket's), starts kubelet too:
	// that choice stands.
	if v, err := node.Active(); err == nil {
		fmt.Fprintf(out, "running Kubernetes %s of this image (this boot's init or join chose it)\n", v)
		return nil
	}
	v, err := handoff.ReadClusterVersion(versionFile)
	from := "the join service's rejoin ticket"
	if errors.Is(err, os.ErrNotExist) {
		p, kerr := kubeadm.KeptSettings(manifests)
		if kerr != nil {
			return fmt.Errorf("this node was told no Kubernetes version this boot (no rejoin ticket), and its kept static pods name none (%w): kubelet does not start", kerr)
		}
		v, err, from = p.KubernetesVersion, nil, "this control plane's kept API server pod"
	}
	if err != nil {
		return fmt.Errorf("%w: kubelet does not start", err)
	}
	if err := node.Activate(v); err != nil {
		return fmt.Errorf("%w: kubelet does not start", err)
	}
	fmt.Fprintf(out, "running Kubernetes %s of this image (the version %s names)\n", v, from)
	return nil
}
