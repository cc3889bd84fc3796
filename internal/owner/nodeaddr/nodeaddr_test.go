package nodeaddr

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestInternalIP(t *testing.T) {
	n := corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "cp-0"},
		{Type: corev1.NodeInternalIP, Address: "10.42.1.100"},
		{Type: corev1.NodeInternalIP, Address: "10.42.9.100"},
	}}}
	if got := InternalIP(n); got != "10.42.1.100" {
		t.Errorf("InternalIP = %q, want the first internal IP", got)
	}
	if got := InternalIP(corev1.Node{}); got != "" {
		t.Errorf("InternalIP of a node without addresses = %q", got)
	}
}
