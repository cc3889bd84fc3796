// Package recoverpb is the wire protocol of `orrery recover`: a node that
// cannot get its state-disk key from the join service waits in its initrd,
// and the owner's CLI sends it the master secret over attested TLS so it can
// derive the key itself.
//
// The messages and their fields are documented in recover.proto. The *.pb.go
// files are generated from it by hack/proto.sh (`make proto`); do not edit
// them by hand.
package recoverpb

// Port is where a control-plane node's initrd serves RecoverService over
// attested TLS while it waits for its state-disk key, next to the
// bootstrapper's port 9000 of a node that was never initialised.
const Port = 9001
