// Package keyservice serves keys derived from the cluster's master secret
// to the join service. It is the only component that reads the master
// secret (from the Secret the first node stored at init, mounted as a
// file); it recomputes every key on each call and stores none.
package keyservice

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/keypb"
)

// MeasurementSecretID is the reserved key ID of the measurement secret.
const MeasurementSecretID = "measurement-secret"

// Server implements keypb.KeyServiceServer.
type Server struct {
	keypb.UnimplementedKeyServiceServer
	// load returns the master secret; it is read per call so a rotated
	// Secret takes effect without a restart.
	load func() (keys.MasterSecret, error)
	log  *slog.Logger
}

// New returns a key service that reads the master secret with load.
func New(load func() (keys.MasterSecret, error), log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{load: load, log: log.With("component", "keyservice")}
}

// GetDataKey implements keypb.KeyServiceServer.
func (s *Server) GetDataKey(_ context.Context, req *keypb.GetDataKeyRequest) (*keypb.GetDataKeyResponse, error) {
	ms, err := s.load()
	if err != nil {
		s.log.Error("cannot read the master secret", "error", err)
		return nil, status.Error(codes.Unavailable, "the key service cannot read the master secret")
	}
	var key []byte
	if req.GetDataKeyId() == MeasurementSecretID {
		if req.GetLength() != 32 {
			return nil, status.Errorf(codes.InvalidArgument, "%s has 32 bytes, not %d", MeasurementSecretID, req.GetLength())
		}
		key, err = ms.MeasurementSecret()
	} else {
		key, err = ms.DeriveKey(req.GetDataKeyId(), int(req.GetLength()))
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// The ID names a disk or a purpose, never a secret; the key is never logged.
	s.log.Info("derived a data key", "keyID", req.GetDataKeyId(), "length", req.GetLength())
	return &keypb.GetDataKeyResponse{DataKey: key}, nil
}

// FileLoader reads the master secret from a file in the format of
// keys.WriteMasterSecretFile (as the init server stores it in the Secret).
func FileLoader(path string) func() (keys.MasterSecret, error) {
	return func() (keys.MasterSecret, error) {
		ms, err := keys.ReadMasterSecretFile(path)
		if err != nil {
			return ms, fmt.Errorf("read master secret: %w", err)
		}
		return ms, nil
	}
}
