// Package ownertest has a fake node for tests of the owner's flows and
// commands: it answers Init as bootstrapperd does but runs no kubeadm. It
// derives the cluster ID from what it receives, so a test checks what the
// owner's side sent. Serve puts it, or any init service, behind attested
// TLS from a real swtpm.
package ownertest

import (
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// Serve serves svc (nil: no service, attested TLS alone) over attested TLS
// in which n attests, as bootstrapperd does, and returns the address. With
// after > 0 the port opens only after that long (a node still booting);
// Serve returns at once. The server stops when the test ends.
func Serve(t testing.TB, n *qemutest.Node, svc initpb.InitServiceServer, after time.Duration) string {
	t.Helper()
	register := func(srv *grpc.Server) {
		if svc != nil {
			initpb.RegisterInitServiceServer(srv, svc)
		}
	}
	if after <= 0 {
		return atlstest.Serve(t, atls.Config{Issuer: n.Issuer}, register)
	}
	creds, err := atls.NewCredentials(atls.Config{Issuer: n.Issuer})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	register(srv)
	t.Cleanup(srv.Stop)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	time.AfterFunc(after, func() {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		go srv.Serve(lis)
	})
	return addr
}

// ClusterID is the cluster ID a node derives from an init request, or an
// InvalidArgument status.
func ClusterID(req *initpb.InitRequest) ([]byte, error) {
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id, err := keys.ClusterID(msec, req.GetMeasurementSalt())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return id, nil
}

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
	id, err := ClusterID(req)
	if err != nil {
		return err
	}
	return stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Done{Done: &initpb.InitSuccess{Kubeconfig: []byte("kubeconfig"), ClusterId: id}}})
}

// Requests returns the Init requests the node received, oldest first.
func (n *Node) Requests() []*initpb.InitRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*initpb.InitRequest(nil), n.requests...)
}
