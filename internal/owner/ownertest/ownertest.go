// Package ownertest has a fake node for tests of the owner's flows and
// commands: it answers Init as bootstrapperd does but runs no kubeadm. It
// derives the cluster ID from what it receives, so a test checks what the
// owner's side sent.
package ownertest

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// InitSecret is the init secret the node accepts.
const InitSecret = "s3cret"

// Node is the fake node's init service.
type Node struct {
	initpb.UnimplementedInitServiceServer
	// Fail makes kubeadm fail: the node reports the failure with
	// "the journal" as its journal.
	Fail bool

	mu       sync.Mutex
	requests []*initpb.InitRequest
}

// Init implements initpb.InitServiceServer.
func (n *Node) Init(req *initpb.InitRequest, stream initpb.InitService_InitServer) error {
	n.mu.Lock()
	n.requests = append(n.requests, req)
	n.mu.Unlock()
	if string(req.GetInitSecret()) != InitSecret {
		return status.Error(codes.PermissionDenied, "wrong init secret")
	}
	stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Progress{Progress: &initpb.Progress{Phase: "kubeadm-init", Message: "running kubeadm init"}}})
	stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Log{Log: &initpb.LogChunk{Data: []byte("[certs] Generating \"ca\"\n[kubeconfig] Writing\n")}}})
	if n.Fail {
		return stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Failed{Failed: &initpb.InitFailure{ErrorMessage: "run kubeadm init: exit status 1", Journal: []byte("the journal")}}})
	}
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	id, err := keys.ClusterID(msec, req.GetMeasurementSalt())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Done{Done: &initpb.InitSuccess{Kubeconfig: []byte("kubeconfig"), ClusterId: id}}})
}

// Requests returns the Init requests the node received, oldest first.
func (n *Node) Requests() []*initpb.InitRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*initpb.InitRequest(nil), n.requests...)
}
