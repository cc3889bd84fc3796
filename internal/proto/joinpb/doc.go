// Package joinpb is the wire protocol of the join service: an attested node
// asks for a join ticket (state-disk key, cluster ID secrets, kubelet
// certificate, kubeadm join parameters) the first time it joins, and for a
// rejoin ticket (state-disk key, measurement secret) from its initrd on every
// later boot, after which the initrd proves that the disk it opened is not an
// older copy of itself (its generation).
//
// The messages and their fields are documented in join.proto. The *.pb.go
// files are generated from it by hack/proto.sh (`make proto`); do not edit
// them by hand.
package joinpb

// Port is where the join service serves this protocol over attested TLS,
// on the host network of every control-plane node. The orrery-services
// chart opens the same port.
const Port = 30090
