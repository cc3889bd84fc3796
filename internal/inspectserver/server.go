// Package inspectserver serves inspectpb.InspectService: the owner reads a running
// node's status, journal, systemd units and kernel log, and takes a
// support bundle of them. It only reads, answers only the owner (see
// AuthorizeOwner), bounds every answer, and redacts what looks like a
// secret from the journal.
package inspectserver

import (
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// JournalReader reads the journal (Journalctl).
type JournalReader interface {
	Read(ctx context.Context, q Query, emit func([]*inspectpb.JournalEntry) error) error
}

// UnitLister lists systemd units (orrery-inspectd reads them over D-Bus).
type UnitLister interface {
	Units(ctx context.Context, pattern string) ([]*inspectpb.Unit, error)
}

// Config is what a Server reads from.
type Config struct {
	// Owner returns the public half of the owner's access key (OwnerKey):
	// every call checks that the connection's client proved it.
	// Required.
	Owner   func() (ed25519.PublicKey, error)
	Journal JournalReader
	// Units is nil where no systemd runs (the initrd).
	Units  UnitLister
	Status func() *inspectpb.StatusResponse
	// Usage reads the node's counters (Usage.Read); nil where they are
	// not served (the initrd).
	Usage func() (*inspectpb.UsageResponse, error)
	// Log receives a line per call: who asked, and what.
	Log *slog.Logger
}

// Server implements inspectpb.InspectServiceServer.
type Server struct {
	inspectpb.UnimplementedInspectServiceServer
	cfg Config
}

// New returns the server of cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Owner == nil || cfg.Journal == nil || cfg.Status == nil {
		return nil, errors.New("inspect service: the owner's key, a journal reader and a status are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg}, nil
}

// authorize checks, for every call, what the connection's handshake may
// already have checked: that the client proved the owner's key. It then
// writes the call to the journal.
func (s *Server) authorize(ctx context.Context, call string, args ...any) error {
	p, ok := peer.FromContext(ctx)
	var key any
	if ok {
		if ai, ok := p.AuthInfo.(atls.AuthInfo); ok && len(ai.TLS.PeerCertificates) > 0 {
			key = ai.TLS.PeerCertificates[0].PublicKey
		}
	}
	from := "unknown"
	if ok && p.Addr != nil {
		from = p.Addr.String()
	}
	if err := owneraccess.Authorize(s.cfg.Owner)(key); err != nil {
		s.cfg.Log.Warn("refused a caller that is not the owner", append([]any{"peer", from, "key", owneraccess.Fingerprint(key), "call", call}, args...)...)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	s.cfg.Log.Info("owner request", append([]any{"peer", from, "call", call}, args...)...)
	return nil
}

// Status implements inspectpb.InspectServiceServer.
func (s *Server) Status(ctx context.Context, _ *inspectpb.StatusRequest) (*inspectpb.StatusResponse, error) {
	if err := s.authorize(ctx, "Status"); err != nil {
		return nil, err
	}
	return s.cfg.Status(), nil
}

// Journal implements inspectpb.InspectServiceServer.
func (s *Server) Journal(req *inspectpb.JournalRequest, stream inspectpb.InspectService_JournalServer) error {
	ctx := stream.Context()
	if err := s.authorize(ctx, "Journal", "unit", truncate(req.GetUnit(), 64), "boot", req.GetBoot(), "lines", req.GetLines(), "follow", req.GetFollow(), "kernel", req.GetKernel()); err != nil {
		return err
	}
	q, err := QueryOf(req)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	err = s.cfg.Journal.Read(ctx, q, func(es []*inspectpb.JournalEntry) error {
		return stream.Send(&inspectpb.JournalEntries{Entries: es})
	})
	if err != nil && ctx.Err() == nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	return nil
}

// Units implements inspectpb.InspectServiceServer.
func (s *Server) Units(ctx context.Context, req *inspectpb.UnitsRequest) (*inspectpb.UnitsResponse, error) {
	if err := s.authorize(ctx, "Units", "pattern", truncate(req.GetPattern(), 64)); err != nil {
		return nil, err
	}
	if err := CheckPattern(req.GetPattern()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.cfg.Units == nil {
		return nil, status.Error(codes.FailedPrecondition, "the node is still in its initrd, where no systemd runs: ask for its status and journal")
	}
	units, err := s.cfg.Units.Units(ctx, req.GetPattern())
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &inspectpb.UnitsResponse{Units: units}, nil
}

// Usage implements inspectpb.InspectServiceServer.
func (s *Server) Usage(ctx context.Context, _ *inspectpb.UsageRequest) (*inspectpb.UsageResponse, error) {
	if err := s.authorize(ctx, "Usage"); err != nil {
		return nil, err
	}
	if s.cfg.Usage == nil {
		return nil, status.Error(codes.FailedPrecondition, "the node is still in its initrd, which does not report its usage: ask for its status and journal")
	}
	u, err := s.cfg.Usage()
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return u, nil
}
