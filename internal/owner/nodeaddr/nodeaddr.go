// Package nodeaddr reads where a node is reached from its Node object.
package nodeaddr

import corev1 "k8s.io/api/core/v1"

// InternalIP is the first internal IP the node's kubelet reports (its
// --node-ip), or "" if it reports none. The kubelet writes it: it says
// where to reach the node, never who the node is.
func InternalIP(n corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}
