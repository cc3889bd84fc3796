// Package clusternet holds the network layout of a cluster Orrery sets up,
// the values the owner's CLI, the node's kubeadm configuration and the
// pod network must agree on.
package clusternet

const (
	// APIServerPort is the port of the Kubernetes API server on each
	// control plane.
	APIServerPort = 6443
	// PodCIDR is the pod network: kubeadm's podSubnet on every node and
	// the pod network's (flannel's) range.
	PodCIDR = "10.244.0.0/16"
	// DefaultServiceCIDR is the range of Kubernetes Services unless the
	// owner picks another at init.
	DefaultServiceCIDR = "10.96.0.0/12"
)
