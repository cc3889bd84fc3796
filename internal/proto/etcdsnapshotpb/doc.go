// Package etcdsnapshotpb is etcd's snapshot call, the one part of etcd's
// API a node's bootstrapperd needs (see snapshot.proto). The *.pb.go files
// are generated from it by hack/proto.sh (`make proto`).
package etcdsnapshotpb
