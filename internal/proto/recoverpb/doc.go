// Package recoverpb is the wire protocol of `orrery recover`: a node that
// cannot get its state-disk key from the join service waits in its initrd,
// and the owner's CLI sends it the master secret over attested TLS so it can
// derive the key itself.
//
// The messages and their fields are documented in recover.proto. The *.pb.go
// files are generated from it by hack/proto.sh (`make proto`); do not edit
// them by hand.
package recoverpb
