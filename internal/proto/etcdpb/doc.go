// Package etcdpb is the part of etcd's API a node's bootstrapperd needs:
// snapshots, a member's status and the cluster's membership (see
// etcd.proto). The *.pb.go files are generated from it by hack/proto.sh
// (`make proto`).
package etcdpb
