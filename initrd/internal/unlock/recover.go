package unlock

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
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
}

// Recover implements recoverpb.RecoverServiceServer. The master secret is
// neither logged nor kept: only the keys derived from it reach the
// Unlocker.
func (s *RecoverServer) Recover(ctx context.Context, req *recoverpb.RecoverRequest) (*recoverpb.RecoverResponse, error) {
	from := "the owner"
	if p, ok := peer.FromContext(ctx); ok {
		from = "the owner at " + p.Addr.String()
	}
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	if err := ms.Validate(); err != nil {
		s.Say("refused a recovery from %s: %v", from, err)
		return nil, status.Errorf(codes.InvalidArgument, "%v: send the master secret file 'orrery init' wrote", err)
	}
	diskKey, err := ms.DiskKey(s.DiskUUID)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "derive the disk key: %v", err)
	}
	secret, err := ms.MeasurementSecret()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "derive the measurement secret: %v", err)
	}
	err = s.Unlocker.Try(ctx, Key{DiskKey: diskKey, MeasurementSecret: secret, From: from})
	switch {
	case errors.Is(err, ErrWrongKey):
		s.Say("refused a recovery from %s: its master secret does not open the state disk (UUID %s), which is untouched; still waiting", from, s.DiskUUID)
		return nil, status.Errorf(codes.PermissionDenied,
			"this master secret does not open the node's state disk (UUID %s): it belongs to another cluster; send the master secret file 'orrery init' wrote for this node's cluster. The node is unchanged and keeps waiting", s.DiskUUID)
	case errors.Is(err, ErrOpen):
		return nil, status.Errorf(codes.AlreadyExists, "the node's state disk is open already: it got its key from %s and boots on", s.Unlocker.Key().From)
	case err != nil:
		s.Say("a recovery from %s failed: %v", from, err)
		return nil, status.Errorf(codes.Internal, "open the state disk: %v", err)
	}
	return &recoverpb.RecoverResponse{}, nil
}
