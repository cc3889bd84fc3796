// Package keypb is the wire protocol of the key service, which holds the
// master secret inside the cluster and derives keys from it (HKDF-SHA256, the
// key ID as info string) for the join service.
//
// The messages and their fields are documented in key.proto. The *.pb.go
// files are generated from it by hack/proto.sh (`make proto`); do not edit
// them by hand.
package keypb
