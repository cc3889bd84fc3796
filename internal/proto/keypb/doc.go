// Package keypb is the wire protocol of the key service, which holds the
// master secret inside the cluster and derives keys from it (HKDF-SHA256, the
// key ID as info string) for the join service.
//
// The messages and their fields are documented in key.proto. The *.pb.go
// files are generated from it by hack/proto.sh (`make proto`); do not edit
// them by hand.
package keypb

// Reserved key IDs: GetDataKey answers them with something other than a
// data key of that ID.
const (
	// MeasurementSecretID is the cluster's 32-byte measurement secret
	// (keys.MasterSecret.MeasurementSecret), which joining nodes receive.
	MeasurementSecretID = "measurement-secret"
	// OwnerAccessKeyID is the 32-byte public half of the owner's access
	// key (keys.MasterSecret.OwnerAccessKey), with which joining nodes
	// recognise their owner. The private half is never served.
	OwnerAccessKeyID = "owner-access-key"
)
