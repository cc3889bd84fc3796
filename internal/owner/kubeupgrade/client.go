package kubeupgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

// Releases is what a node said of its Kubernetes releases.
type Releases struct {
	Carried      []string
	Running      string
	ControlPlane bool
}

// Remote is a node's upgrade service over attested TLS, reached by the
// owner's check (inspect.Owner): one of the owner's images, locked to the
// owner's cluster, the instance named.
type Remote struct {
	*inspect.Attested
	client   kubeupgradepb.KubernetesUpgradeServiceClient
	Releases Releases
}

// DialNode reaches the upgrade service of the node name whose address
// (an IP, as its Node lists it) is ip, on the port every node serves it.
func DialNode(ctx context.Context, owner inspect.Owner, name, ip string) (*Remote, error) {
	return Dial(ctx, owner, net.JoinHostPort(ip, strconv.Itoa(kubeupgradepb.Port)), name)
}

// Dial reaches the upgrade service at addr of the node name, and asks for
// its releases.
func Dial(ctx context.Context, owner inspect.Owner, addr, name string) (*Remote, error) {
	var rel *kubeupgradepb.ReleasesResponse
	a, err := owner.DialService(ctx, addr, name, "Kubernetes upgrade service", func(ctx context.Context, conn *grpc.ClientConn, p *peer.Peer) error {
		var err error
		rel, err = kubeupgradepb.NewKubernetesUpgradeServiceClient(conn).Releases(ctx, &kubeupgradepb.ReleasesRequest{}, grpc.Peer(p))
		return err
	})
	if err != nil {
		return nil, err
	}
	if !a.Locked {
		a.Close()
		return nil, fmt.Errorf("%s at %s is not locked to this cluster (PCR 15): it waits in its initrd; 'orrery verify %s' says more", name, addr, name)
	}
	return &Remote{Attested: a, client: kubeupgradepb.NewKubernetesUpgradeServiceClient(a.Conn),
		Releases: Releases{Carried: rel.GetCarried(), Running: rel.GetRunning(), ControlPlane: rel.GetControlPlane()}}, nil
}

// Upgrade implements NodeClient.
func (r *Remote) Upgrade(ctx context.Context, version string, apply bool, line func(string)) error {
	step := kubeupgradepb.Step_STEP_NODE
	if apply {
		step = kubeupgradepb.Step_STEP_APPLY
	}
	stream, err := r.client.Upgrade(ctx, &kubeupgradepb.UpgradeRequest{KubernetesVersion: version, Step: step})
	if err != nil {
		return termtext.Error(err)
	}
	return each(stream.Recv, func(m *kubeupgradepb.UpgradeOutput) error {
		for _, l := range m.GetLines() {
			line(termtext.Line(l))
		}
		return nil
	})
}

// BackupEtcd implements NodeClient.
func (r *Remote) BackupEtcd(ctx context.Context, w io.Writer) error {
	stream, err := r.client.BackupEtcd(ctx, &kubeupgradepb.BackupEtcdRequest{})
	if err != nil {
		return termtext.Error(err)
	}
	return each(stream.Recv, func(m *kubeupgradepb.BackupChunk) error {
		_, err := w.Write(m.GetData())
		return err
	})
}

// each hands every message of a stream to f, until the stream ends.
func each[T any](recv func() (T, error), f func(T) error) error {
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return termtext.Error(err)
		}
		if err := f(m); err != nil {
			return err
		}
	}
}

// EtcdMember is a member of etcd, as a control plane sees it.
type EtcdMember struct {
	ID   uint64
	Name string
	// Learner follows the log but does not vote yet.
	Learner bool
	// Healthy says it answered the control plane; Error why not.
	Healthy bool
	Error   string
	Leader  bool
	// RaftIndex is the last index of its log.
	RaftIndex uint64
}

// EtcdMembers lists etcd's members, as the node sees them.
func (r *Remote) EtcdMembers(ctx context.Context) ([]EtcdMember, error) {
	resp, err := r.client.EtcdMembers(ctx, &kubeupgradepb.EtcdMembersRequest{})
	if err != nil {
		return nil, termtext.Error(err)
	}
	return etcdMembers(resp), nil
}

// RemoveEtcdMember asks the node to remove the etcd member of control
// plane name, at address (its IP, if known: a member that never started
// is found by it), and returns the members left. The node refuses (gRPC
// FailedPrecondition) one whose loss etcd's quorum would not survive,
// unless breakQuorum, and etcd refuses some even then; NotFound says
// there is no such member.
func (r *Remote) RemoveEtcdMember(ctx context.Context, name, address string, breakQuorum bool) ([]EtcdMember, error) {
	resp, err := r.client.RemoveEtcdMember(ctx, &kubeupgradepb.RemoveEtcdMemberRequest{Name: name, Address: address, BreakQuorum: breakQuorum})
	if err != nil {
		return nil, termtext.Error(err)
	}
	return etcdMembers(resp), nil
}

func etcdMembers(resp *kubeupgradepb.EtcdMembersResponse) []EtcdMember {
	var out []EtcdMember
	for _, m := range resp.GetMembers() {
		out = append(out, EtcdMember{
			ID: m.GetId(), Name: termtext.Line(m.GetName()), Learner: m.GetLearner(), Healthy: m.GetHealthy(),
			Error: termtext.Line(m.GetError()), Leader: m.GetLeader(), RaftIndex: m.GetRaftIndex(),
		})
	}
	return out
}

// MoveKubeletServingCA implements ServingCAClient.
func (r *Remote) MoveKubeletServingCA(ctx context.Context, certPEM, keyPEM []byte) ([]string, error) {
	resp, err := r.client.MoveKubeletServingCA(ctx, &kubeupgradepb.MoveKubeletServingCARequest{Certificate: certPEM, Key: keyPEM})
	if err != nil {
		return nil, termtext.Error(err)
	}
	var out []string
	for _, p := range resp.GetRewrote() {
		out = append(out, termtext.Line(p))
	}
	return out, nil
}

// RenewKubeletServingCertificate implements ServingCAClient.
func (r *Remote) RenewKubeletServingCertificate(ctx context.Context) error {
	_, err := r.client.RenewKubeletServingCertificate(ctx, &kubeupgradepb.RenewKubeletServingCertificateRequest{})
	return termtext.Error(err)
}
