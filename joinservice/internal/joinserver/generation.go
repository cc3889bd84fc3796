package joinserver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/joinservice/internal/admissions"
)

// CheckDiskGeneration implements joinpb.JoinServiceServer: a rejoining
// node presents the generation its state disk holds, and gets the next
// one to write if the disk is not an older copy of itself.
func (s *Server) CheckDiskGeneration(ctx context.Context, req *joinpb.CheckDiskGenerationRequest) (*joinpb.CheckDiskGenerationResponse, error) {
	presented := req.GetGeneration()
	if presented > admitted.MaxGeneration {
		return nil, status.Errorf(codes.InvalidArgument, "generation %d is more than %d, which no join service issues: the node's disk holds something else than its generation", presented, uint64(admitted.MaxGeneration))
	}
	r, err := s.checkRejoin(ctx, req.GetDiskUuid())
	if err != nil {
		return nil, err
	}
	next, err := s.cfg.Admissions.CheckGeneration(ctx, r.disk, presented)
	var older *admitted.GenerationError
	switch {
	case errors.As(err, &older):
		r.log.Warn("refused a rejoin: the state disk is an older copy of itself", "presented", older.Presented, "recorded", older.Recorded, "superseded", older.Superseded)
		return nil, status.Error(codes.FailedPrecondition, olderDiskMessage(r, older))
	case err != nil:
		return nil, s.generationStoreError(r, "check the state disk's generation", err)
	}
	if issued := max(r.rec.Generation, r.rec.NextGeneration); presented > issued {
		// Either the disk never rejoined since generations exist (0 on
		// both sides is the common case, and logs nothing), or the
		// record is older than the disk.
		r.log.Warn("the state disk presents a generation above every one issued for it: its record is older than the disk (restored from a backup, or the cluster's etcd rolled back); accepted",
			"presented", presented, "recorded", r.rec.Generation, "issued", issued)
	}
	r.log.Info("checked the state disk's generation", "presented", presented, "next", next)
	return &joinpb.CheckDiskGenerationResponse{NextGeneration: next}, nil
}

// RecordDiskGeneration implements joinpb.JoinServiceServer: the node's
// disk holds the generation CheckDiskGeneration issued it.
func (s *Server) RecordDiskGeneration(ctx context.Context, req *joinpb.RecordDiskGenerationRequest) (*joinpb.RecordDiskGenerationResponse, error) {
	g := req.GetGeneration()
	if g == 0 || g > admitted.MaxGeneration {
		return nil, status.Errorf(codes.InvalidArgument, "generation %d is not one a join service issues (1 to %d)", g, uint64(admitted.MaxGeneration))
	}
	r, err := s.checkRejoin(ctx, req.GetDiskUuid())
	if err != nil {
		return nil, err
	}
	err = s.cfg.Admissions.RecordGeneration(ctx, r.disk, g)
	switch {
	case errors.Is(err, admitted.ErrNotIssued):
		r.log.Warn("did not record the state disk's generation: it is not the one issued last", "generation", g)
		return nil, status.Errorf(codes.Aborted, "generation %d of state disk %s is not the one the join service issued last: another boot of this disk checked its generation since; check it again", g, r.disk)
	case err != nil:
		return nil, s.generationStoreError(r, "record the state disk's generation", err)
	}
	r.log.Info("recorded the state disk's generation", "generation", g)
	return &joinpb.RecordDiskGenerationResponse{}, nil
}

// generationStoreError is the status for a record that cannot take the
// disk's generation: gone or removed since the rejoin checks read it, or
// out of reach.
func (s *Server) generationStoreError(r rejoining, what string, err error) error {
	switch {
	case errors.Is(err, admissions.ErrRemoved), errors.Is(err, admissions.ErrNotFound):
		r.log.Warn("refused a rejoin: the state disk's record is gone or removed", "reason", err.Error())
		return status.Errorf(codes.PermissionDenied, "%s: %v; to bring this VM back, recreate it with a new disk and name and let it join as a new node", what, err)
	default:
		r.log.Error("cannot "+what, "error", err.Error())
		return status.Errorf(codes.Unavailable, "%s: %v", what, err)
	}
}

// olderDiskMessage tells the owner, on the node's console, what happened
// and what to do.
func olderDiskMessage(r rejoining, e *admitted.GenerationError) string {
	return fmt.Sprintf("%v, so node %s does not boot on it: whoever controls the node's disks swapped it for a copy of it, which the same key opens. "+
		"Remove the node ('orrery node remove %s --yes') and create a new one in its place. "+
		"Or, if you restored this copy on purpose and accept losing what the node did since, set the cluster's record to it "+
		`(kubectl patch admittednode disk-%s --type merge -p '{"spec":{"generation":%d,"nextGeneration":null}}') and start the node again`,
		e, r.inst.Name, r.inst.Name, r.disk, e.Presented)
}
