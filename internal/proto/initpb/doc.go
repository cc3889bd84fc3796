// Package initpb is the wire protocol of `orrery init`: the owner's CLI sends
// the master secret and cluster parameters to the first control-plane node
// over attested TLS and receives a stream of progress messages that ends with
// the kubeconfig and cluster ID, or with an error and the node's journal.
//
// The messages and their fields are documented in init.proto. The *.pb.go
// files are generated from it by hack/proto.sh (`make proto`); do not edit
// them by hand.
package initpb

// Port is where bootstrapperd serves this protocol over attested TLS, on
// every node that belongs to no cluster yet. bootstrapperd.socket listens
// on the same port.
const Port = 9000
