// Package keyservice serves keys derived from the cluster's master secret
// to the join service. It is the only component that reads the master
// secret (from the Secret the first node stored at init, mounted as a
// file); it recomputes every key on each call and stores none.
package keyservice

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/keypb"
)

const (
	// maxKeyID bounds a key ID: a disk key's is 41 bytes ("disk:" and a
	// UUID), the rest is room for other purposes.
	maxKeyID = 128
	// MaxRequestSize bounds a GetDataKeyRequest on the wire, for the
	// gRPC server's MaxRecvMsgSize: the largest valid one has 133 bytes.
	MaxRequestSize = 1 << 10
)

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

// GetDataKey implements keypb.KeyServiceServer. The request is checked
// before the master secret is read, and an error never quotes more of it
// than maxKeyID bytes.
func (s *Server) GetDataKey(_ context.Context, req *keypb.GetDataKeyRequest) (*keypb.GetDataKeyResponse, error) {
	if err := check(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ms, err := s.load()
	if err != nil {
		s.log.Error("cannot read the master secret", "error", err)
		return nil, status.Error(codes.Unavailable, "the key service cannot read the master secret")
	}
	key, err := Derive(ms, req.GetDataKeyId(), int(req.GetLength()))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// The ID names a disk or a purpose, never a secret; the key is never logged.
	s.log.Info("derived a data key", "keyID", req.GetDataKeyId(), "length", req.GetLength())
	return &keypb.GetDataKeyResponse{DataKey: key}, nil
}

// Derive is what the key service answers for id and length, reserved IDs
// (keypb.MeasurementSecretID, keypb.OwnerAccessKeyID) included; tests of
// the join service use it as their key service.
func Derive(ms keys.MasterSecret, id string, length int) ([]byte, error) {
	switch id {
	case keypb.MeasurementSecretID:
		return ms.MeasurementSecret()
	case keypb.OwnerAccessKeyID:
		k, err := ms.OwnerAccessKey()
		if err != nil {
			return nil, err
		}
		return k.Public().(ed25519.PublicKey), nil
	}
	return ms.DeriveKey(id, length)
}

// check refuses a key ID or a length that no caller needs.
func check(req *keypb.GetDataKeyRequest) error {
	id, n := req.GetDataKeyId(), req.GetLength()
	switch {
	case id == "":
		return errors.New("the key ID is empty")
	case len(id) > maxKeyID:
		return fmt.Errorf("the key ID has %d bytes, at most %d", len(id), maxKeyID)
	case (id == keypb.MeasurementSecretID || id == keypb.OwnerAccessKeyID) && n != 32:
		return fmt.Errorf("%s has 32 bytes, not %d", id, n)
	case n < keys.MinKeyLength || n > keys.MaxKeyLength:
		return fmt.Errorf("a data key has %d to %d bytes, not %d", keys.MinKeyLength, keys.MaxKeyLength, n)
	}
	return nil
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
