// Package inspectpb is the wire protocol with which the owner inspects a
// running node: its status, journal, systemd units and kernel log.
//
// The messages and their fields are documented in inspect.proto. The *.pb.go
// files are generated from it by hack/proto.sh (`make proto`); do not edit
// them by hand.
package inspectpb

// Port is where a node serves InspectService over attested TLS: from the
// system's orrery-inspectd.socket, and in a control-plane node's initrd
// beside RecoverService (recoverpb.Port is the same port).
const Port = 9001
