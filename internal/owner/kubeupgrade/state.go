// Package kubeupgrade is the owner's side of a Kubernetes upgrade: it reads
// where the cluster's nodes stand, plans the upgrade to the next release
// (control planes first, then each worker), refuses what Kubernetes' skew
// rules forbid before anything changes, backs up etcd, and then has each
// node run kubeadm's upgrade through the node's upgrade service
// (kubeupgradepb), cordoning and draining workers around theirs.
//
// A plan is made from the cluster as it is, so running an upgrade again
// after it was interrupted goes on where it stopped.
package kubeupgrade

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/owner/nodeaddr"
	"github.com/orrery-dev/orrery/internal/records/kubeadmconfig"
)

// CordonedAnnotation marks a node that the upgrade cordoned, with the
// version it upgrades to: the upgrade uncordons only those, never a node
// the owner cordoned.
const CordonedAnnotation = "orrery.dev/cordoned-for-kubernetes-upgrade"

// controlPlaneLabel is the label kubeadm puts on control planes.
const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

// State is where the cluster stands.
type State struct {
	// ClusterVersion is kubeadm's record of the cluster's version
	// (kubeadmconfig): it moves when kubeadm upgrade apply ran.
	ClusterVersion string
	// KubeProxy is the version kube-proxy's DaemonSet runs, "" if the
	// cluster has none: kubeadm upgrade apply moves it last.
	KubeProxy string
	Nodes     []Node
}

// Node is one node.
type Node struct {
	Name         string
	ControlPlane bool
	// Kubelet is the version the node's kubelet reports.
	Kubelet string
	Ready   bool
	// Cordoned tells whether the node is unschedulable; CordonedFor is
	// the version of the upgrade that cordoned it, "" if none did.
	Cordoned    bool
	CordonedFor string
	// Components are a control plane's static pods' versions, by
	// component (kube-apiserver, ...), from their images' tags.
	Components map[string]string
	// Address is the node's internal IP.
	Address string
	// KubeletCA is the file a control plane's API server checks kubelets'
	// serving certificates against (--kubelet-certificate-authority),
	// from its pod.
	KubeletCA string
}

// Components are the control-plane components whose version moves with
// the cluster's (etcd's follows its own).
var Components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// Read reads the cluster's state.
func Read(ctx context.Context, client kubernetes.Interface) (State, error) {
	var s State
	cm, err := client.CoreV1().ConfigMaps(kubeadmconfig.Namespace).Get(ctx, kubeadmconfig.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return State{}, fmt.Errorf("read kubeadm's record of the cluster: %w", err)
	}
	if s.ClusterVersion, err = kubeadmconfig.KubernetesVersion(cm.Data); err != nil {
		return State{}, err
	}
	ds, err := client.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err == nil && len(ds.Spec.Template.Spec.Containers) > 0 {
		s.KubeProxy = imageTag(ds.Spec.Template.Spec.Containers[0].Image)
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return State{}, fmt.Errorf("list the nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: "tier=control-plane"})
	if err != nil {
		return State{}, fmt.Errorf("list the control planes' pods: %w", err)
	}
	for _, n := range nodes.Items {
		s.Nodes = append(s.Nodes, readNode(n, pods.Items))
	}
	// Control planes first, each group by name: the order of the upgrade.
	slices.SortFunc(s.Nodes, func(a, b Node) int {
		if a.ControlPlane != b.ControlPlane {
			if a.ControlPlane {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return s, nil
}

func readNode(n corev1.Node, pods []corev1.Pod) Node {
	_, cp := n.Labels[controlPlaneLabel]
	out := Node{Name: n.Name, ControlPlane: cp, Kubelet: n.Status.NodeInfo.KubeletVersion,
		Cordoned: n.Spec.Unschedulable, CordonedFor: n.Annotations[CordonedAnnotation], Components: map[string]string{}}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Ready = c.Status == corev1.ConditionTrue
		}
	}
	out.Address = nodeaddr.InternalIP(n)
	for _, p := range pods {
		if p.Spec.NodeName != n.Name || len(p.Spec.Containers) == 0 {
			continue
		}
		c := p.Labels["component"]
		if slices.Contains(Components, c) {
			out.Components[c] = imageTag(p.Spec.Containers[0].Image)
		}
		if c == "kube-apiserver" {
			out.KubeletCA = flagValue(p.Spec.Containers[0].Command, "kubelet-certificate-authority")
		}
	}
	return out
}

// imageTag is the tag of an image reference, "" if it has none.
func imageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ""
	}
	return ref[i+1:]
}

// flagValue is the value of the last --name=VALUE in command, "" if none.
func flagValue(command []string, name string) string {
	var v string
	for _, a := range command {
		if after, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			v = after
		}
	}
	return v
}
