package unlock

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
	"github.com/orrery-dev/orrery/internal/statuslimit"
)

// RecoverServer serves RecoverService: the owner sends the master secret,
// from which the node derives its disk key and measurement secret.
type RecoverServer struct {
	recoverpb.UnimplementedRecoverServiceServer
	// DiskUUID is the state disk's LUKS UUID.
	DiskUUID string
	Unlocker *Unlocker
	// Say writes a line on the console.
	Say func(format string, args ...any)

	// tries holds the one recovery whose key is being tried on the disk
	// (see acquire); busyWait is how long another waits for it, zero
	// meaning 2 seconds.
	triesOnce sync.Once
	tries     chan struct{}
	busyWait  time.Duration
}

// Recover implements recoverpb.RecoverServiceServer. The master secret is
// neither logged nor kept: only the keys derived from it reach the
// Unlocker.
//
// Until its master secret opens the disk the peer is anyone on the
// network, so a request costs a bounded amount: the gRPC server takes
// requests of at most 4 KiB (initrd/init), the fields' lengths are
// checked before anything else, one key at a time is tried on the disk,
// and an error says at most statuslimit.MaxMessage bytes.
func (s *RecoverServer) Recover(ctx context.Context, req *recoverpb.RecoverRequest) (*recoverpb.RecoverResponse, error) {
	resp, err := s.tryRecover(ctx, req)
	if err != nil {
		return nil, statuslimit.Cut(err)
	}
	return resp, nil
}

func (s *RecoverServer) tryRecover(ctx context.Context, req *recoverpb.RecoverRequest) (*recoverpb.RecoverResponse, error) {
	from := "the owner"
	if p, ok := peer.FromContext(ctx); ok {
		from = "the owner at " + p.Addr.String()
	}
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	if err := ms.Validate(); err != nil {
		s.Say("refused a recovery from %s: %v", from, err)
		return nil, status.Errorf(codes.InvalidArgument, "%v: send the master secret file 'orrery init' wrote", err)
	}
	// The owner's word that this node is its cluster's control plane:
	// the metadata service that made the node serve recovery is the
	// host's, and must not decide what the disk may keep.
	if len(req.GetClusterCaCert()) == 0 || req.GetApiServerEndpoint() == "" {
		s.Say("refused a recovery from %s: it names no cluster CA certificate and API server (an orrery older than this image)", from)
		return nil, status.Error(codes.InvalidArgument,
			"the request names no cluster CA certificate and API server endpoint, so the node cannot check what its disk keeps: recover with the orrery built with this node's image")
	}
	cluster, err := checkedCluster(req.GetClusterCaCert(), req.GetApiServerEndpoint(), true)
	if err != nil {
		s.Say("refused a recovery from %s: %v", from, err)
		return nil, status.Errorf(codes.InvalidArgument, "the request's cluster: %v: send the cluster CA and API server of the admin kubeconfig 'orrery init' wrote", err)
	}
	diskKey, err := ms.DiskKey(s.DiskUUID)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "derive the disk key: %v", err)
	}
	secret, err := ms.MeasurementSecret()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "derive the measurement secret: %v", err)
	}
	owner, err := ms.OwnerAccessKey()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "derive the owner's access key: %v", err)
	}
	release, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	err = s.Unlocker.Try(ctx, Key{DiskKey: diskKey, MeasurementSecret: secret, Cluster: cluster, OwnerAccessKey: owner.Public().(ed25519.PublicKey), From: from})
	switch {
	case errors.Is(err, ErrWrongKey):
		s.Say("refused a recovery from %s: its master secret does not open the state disk (UUID %s), which is untouched; still waiting", from, s.DiskUUID)
		return nil, status.Errorf(codes.PermissionDenied,
			"this master secret does not open the node's state disk (UUID %s): it belongs to another cluster; send the master secret file 'orrery init' wrote for this node's cluster. The node is unchanged and keeps waiting", s.DiskUUID)
	case errors.Is(err, ErrOpen):
		return nil, status.Errorf(codes.AlreadyExists, "the node's state disk is open already: it got its key from %s and boots on", s.Unlocker.Key().From)
	case errors.Is(err, ErrRefused):
		s.Say("refused a recovery from %s: %v", from, err)
		return nil, status.Errorf(codes.FailedPrecondition,
			"%v. Whoever controls the node's disks changed this one: do not recover this node; replace its state disk with a blank one and join it as a new node", err)
	case err != nil:
		s.Say("a recovery from %s failed: %v", from, err)
		return nil, status.Errorf(codes.Internal, "open the state disk: %v", err)
	}
	return &recoverpb.RecoverResponse{}, nil
}

// acquire waits for the recovery whose key is being tried on the disk,
// if any, for at most busyWait, and returns what ends this one's turn.
// Trying a key runs cryptsetup, and the Unlocker tries one key at a time:
// without a bound, a flood of recoveries would queue goroutines and
// requests without end, and the owner's behind them.
func (s *RecoverServer) acquire(ctx context.Context) (release func(), err error) {
	s.triesOnce.Do(func() { s.tries = make(chan struct{}, 1) })
	wait := s.busyWait
	if wait == 0 {
		wait = 2 * time.Second
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s.tries <- struct{}{}:
		return func() { <-s.tries }, nil
	case <-t.C:
		return nil, status.Error(codes.Unavailable, "the node is busy trying another recovery's master secret: try again in a few seconds")
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}
