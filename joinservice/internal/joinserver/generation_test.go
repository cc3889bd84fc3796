package joinserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// joined is an env whose node joined with disk uuid.
func joined(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, envOptions{})
	if _, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+qemutest.DefaultName, []string{"system:nodes"}),
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

func checkGen(c joinpb.JoinServiceClient, g uint64) (uint64, error) {
	resp, err := c.CheckDiskGeneration(context.Background(), &joinpb.CheckDiskGenerationRequest{DiskUuid: uuid, Generation: g})
	return resp.GetNextGeneration(), err
}

func recordGen(c joinpb.JoinServiceClient, g uint64) error {
	_, err := c.RecordDiskGeneration(context.Background(), &joinpb.RecordDiskGenerationRequest{DiskUuid: uuid, Generation: g})
	return err
}

// The join service accepts the generation a disk holds if it is the
// disk's current one, issues a newer one, and records it; it refuses an
// older copy with what happened and what to do, and records nothing.
func TestDiskGeneration(t *testing.T) {
	e := joined(t)
	// The first rejoin of a disk the record holds no generation for
	// (new, or admitted before generations): it holds none either.
	var disk uint64
	for want := uint64(1); want <= 3; want++ {
		next, err := checkGen(e.attested, disk)
		if err != nil || next != want {
			t.Fatalf("check %d = %d, %v; want %d", disk, next, err, want)
		}
		disk = next
		if err := recordGen(e.attested, disk); err != nil {
			t.Fatal(err)
		}
	}
	if rec, _, _ := e.admissions.Lookup(context.Background(), uuid); rec.Generation != 3 || rec.NextGeneration != 0 {
		t.Fatalf("record holds %d (next %d), want 3", rec.Generation, rec.NextGeneration)
	}

	// The host swaps in the copy it took after the first rejoin.
	_, err := checkGen(e.attested, 1)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("older copy: err = %v, want FailedPrecondition", err)
	}
	for _, want := range []string{
		"state disk " + strings.ToLower(uuid) + " presents generation 1 but the cluster recorded 3: it is an older copy of the disk",
		"node " + qemutest.DefaultName + " does not boot on it",
		"orrery node remove " + qemutest.DefaultName + " --yes",
		`kubectl patch admittednode disk-` + strings.ToLower(uuid) + ` --type merge -p '{"spec":{"generation":1,"nextGeneration":null}}'`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not say %q", err, want)
		}
	}
	if !strings.Contains(e.logs.String(), "refused a rejoin: the state disk is an older copy of itself") || !strings.Contains(e.logs.String(), "presented=1 recorded=3") {
		t.Errorf("refusal not logged:\n%s", e.logs)
	}
	if rec, _, _ := e.admissions.Lookup(context.Background(), uuid); rec.Generation != 3 || rec.NextGeneration != 0 {
		t.Fatalf("a refused check changed the record: %d (next %d)", rec.Generation, rec.NextGeneration)
	}
	// A generation never issued, or no longer the last issued, is not
	// recorded.
	if err := recordGen(e.attested, 9); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "check it again") {
		t.Fatalf("recording a generation never issued: %v, want Aborted", err)
	}
	// The live disk goes on.
	if next, err := checkGen(e.attested, 3); err != nil || next != 4 {
		t.Fatalf("the live disk: %d, %v", next, err)
	}
}

// What a node sends is checked before anything is read or written: no
// generation a join service would not issue, no caller that could not
// have a rejoin ticket.
func TestDiskGenerationRefusals(t *testing.T) {
	e := joined(t)
	other := newEnv(t, envOptions{}) // a cluster that never admitted the disk
	tests := map[string]struct {
		call     func() error
		wantCode codes.Code
		wantMsg  string
	}{
		"huge":            {func() error { _, err := checkGen(e.attested, admitted.MaxGeneration+1); return err }, codes.InvalidArgument, "more than 9007199254740991"},
		"uint64 max":      {func() error { _, err := checkGen(e.attested, ^uint64(0)); return err }, codes.InvalidArgument, "more than"},
		"int64 negative":  {func() error { _, err := checkGen(e.attested, 1<<63); return err }, codes.InvalidArgument, "more than"},
		"record zero":     {func() error { return recordGen(e.attested, 0) }, codes.InvalidArgument, "not one a join service issues"},
		"record huge":     {func() error { return recordGen(e.attested, ^uint64(0)) }, codes.InvalidArgument, "not one a join service issues"},
		"unattested":      {func() error { _, err := checkGen(e.plain, 0); return err }, codes.PermissionDenied, "did not attest"},
		"unattested rec.": {func() error { return recordGen(e.plain, 1) }, codes.PermissionDenied, "did not attest"},
		"another VM":      {func() error { _, err := checkGen(e.other, 0); return err }, codes.PermissionDenied, "not for this node"},
		"never admitted":  {func() error { _, err := checkGen(other.attested, 0); return err }, codes.PermissionDenied, "never admitted"},
		"bad disk UUID": {func() error {
			_, err := e.attested.CheckDiskGeneration(context.Background(), &joinpb.CheckDiskGenerationRequest{DiskUuid: "../x"})
			return err
		}, codes.InvalidArgument, "malformed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.wantCode, tc.wantMsg)
			}
		})
	}
	if rec, _, _ := e.admissions.Lookup(context.Background(), uuid); rec.Generation != 0 || rec.NextGeneration != 0 {
		t.Fatalf("refused calls changed the record: %d (next %d)", rec.Generation, rec.NextGeneration)
	}

	// The owner removes the node: its disk's generation is neither
	// checked nor recorded.
	next, err := checkGen(e.attested, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.admissions.Remove(uuid, time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC).Format(time.RFC3339))
	if err := recordGen(e.attested, next); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "orrery node remove") {
		t.Fatalf("recording for a removed node: %v, want PermissionDenied", err)
	}
	if _, err := checkGen(e.attested, 0); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("checking for a removed node: %v, want PermissionDenied", err)
	}
}

// A disk newer than its record (the record restored from a backup, or
// the cluster's etcd rolled back) is accepted, and said in the log.
func TestDiskNewerThanItsRecord(t *testing.T) {
	e := joined(t)
	e.admissions.SetGeneration(uuid, 2, 0)
	next, err := checkGen(e.attested, 7)
	if err != nil || next != 8 {
		t.Fatalf("check 7 against record 2 = %d, %v; want 8", next, err)
	}
	if !strings.Contains(e.logs.String(), "its record is older than the disk") {
		t.Errorf("not logged:\n%s", e.logs)
	}
	// The owner restored an older copy on purpose and set the record to
	// it, as the refusal says: the copy boots.
	e.admissions.SetGeneration(uuid, 1, 0)
	if _, err := checkGen(e.attested, 1); err != nil {
		t.Fatalf("after the owner set the record: %v", err)
	}
}
