// Package kubeupgradepb is the wire protocol with which the owner upgrades
// a node's Kubernetes release and backs up a control plane's etcd.
//
// The messages and their fields are documented in kubeupgrade.proto. The
// *.pb.go files are generated from it by hack/proto.sh (`make proto`); do
// not edit them by hand.
package kubeupgradepb

// Port is where a node serves KubernetesUpgradeService over attested TLS,
// from the system's orrery-kubernetes-upgrade.socket.
const Port = 9002
