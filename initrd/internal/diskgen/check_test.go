package diskgen

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
)

const uuid = "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"

// service is a join service's record of the disk, with the record's own
// rules (internal/records/admitted), and what the test makes it do. It notes
// what the disk held at each call: the node must have written before it
// records.
type service struct {
	t    *testing.T
	path string

	mu  sync.Mutex
	rec admitted.Record
	// calls are the calls in order, with what the disk held then.
	calls []string
	// unimplemented answers as a join service older than the check.
	unimplemented bool
	// failRecords fails as many record calls before (lost) or after
	// (answer lost) applying them.
	failRecords, loseRecordAnswers int
	// badNext answers this as the next generation, once.
	badNext uint64
}

func newService(t *testing.T, rec admitted.Record) *service {
	rec.DiskUUID, rec.Instance = uuid, attestation.Instance{Name: "worker-0", ID: "42"}
	return &service{t: t, path: filepath.Join(t.TempDir(), "var/lib/orrery/disk-generation"), rec: rec}
}

// onDisk is what the disk's file holds, "none" without one.
func (s *service) onDisk() string {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return "none"
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func (s *service) record() admitted.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec
}

func (s *service) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.calls, "; ")
}

// client is the service as the node's gRPC client sees it.
type client struct {
	joinpb.JoinServiceClient // the ticket calls: not used here
	s                        *service
}

func (c client) CheckDiskGeneration(_ context.Context, req *joinpb.CheckDiskGenerationRequest, _ ...grpc.CallOption) (*joinpb.CheckDiskGenerationResponse, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, fmt.Sprintf("check %d (disk %s)", req.GetGeneration(), s.onDisk()))
	if s.unimplemented {
		return nil, status.Error(codes.Unimplemented, "unknown method CheckDiskGeneration")
	}
	if req.GetDiskUuid() != uuid {
		return nil, status.Errorf(codes.InvalidArgument, "disk %q", req.GetDiskUuid())
	}
	rec, err := s.rec.CheckGeneration(req.GetGeneration())
	var older *admitted.GenerationError
	if errors.As(err, &older) {
		return nil, status.Error(codes.FailedPrecondition, older.Error()+"; remove the node ('orrery node remove')")
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.rec = rec
	next := rec.NextGeneration
	if s.badNext != 0 {
		next, s.badNext = s.badNext, 0
	}
	return &joinpb.CheckDiskGenerationResponse{NextGeneration: next}, nil
}

func (c client) RecordDiskGeneration(_ context.Context, req *joinpb.RecordDiskGenerationRequest, _ ...grpc.CallOption) (*joinpb.RecordDiskGenerationResponse, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	disk := s.onDisk()
	s.calls = append(s.calls, fmt.Sprintf("record %d (disk %s)", req.GetGeneration(), disk))
	if want := fmt.Sprint(req.GetGeneration()); disk != want {
		s.t.Errorf("the node records generation %s while its disk holds %s: it must write first", want, disk)
	}
	if s.failRecords > 0 {
		s.failRecords--
		return nil, status.Error(codes.Unavailable, "connection reset")
	}
	rec, err := s.rec.RecordGeneration(req.GetGeneration())
	if err != nil {
		return nil, status.Error(codes.Aborted, err.Error())
	}
	s.rec = rec
	if s.loseRecordAnswers > 0 {
		s.loseRecordAnswers--
		return nil, status.Error(codes.Unavailable, "connection reset")
	}
	return &joinpb.RecordDiskGenerationResponse{}, nil
}

// joinServices routes addresses to services; one not listed is down.
type joinServices map[string]*service

func (j joinServices) Call(ctx context.Context, addr string, call func(context.Context, joinpb.JoinServiceClient, grpc.CallOption) error) error {
	s, ok := j[addr]
	if !ok {
		return fmt.Errorf("dial %s: connection refused", addr)
	}
	return call(ctx, client{s: s}, grpc.EmptyCallOption{})
}

const cp0, cp1 = "10.42.1.100:30090", "10.42.1.101:30090"

func checker(s *service, js joinServices, console *syncbuffer.Buffer) *Checker {
	return &Checker{
		JoinService: js, DiskUUID: uuid, Path: s.path, First: cp0,
		Others: func(context.Context) ([]string, error) { return []string{cp0, cp1}, nil },
		Say:    func(format string, args ...any) { fmt.Fprintf(console, format+"\n", args...) },
		Retry:  time.Millisecond, MaxRetry: time.Millisecond,
	}
}

func run(t *testing.T, c *Checker) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Run(ctx)
}

// The node writes the next generation, and only then has it recorded;
// it presents what its disk holds.
func TestWritesBeforeRecording(t *testing.T) {
	s := newService(t, admitted.Record{})
	var console syncbuffer.Buffer
	c := checker(s, joinServices{cp0: s}, &console)
	for range 2 {
		if err := run(t, c); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := s.log(), "check 0 (disk none); record 1 (disk 1); check 1 (disk 1); record 2 (disk 2)"; got != want {
		t.Errorf("calls: %s\nwant:  %s", got, want)
	}
	if rec := s.record(); rec.Generation != 2 || rec.NextGeneration != 0 || s.onDisk() != "2" {
		t.Errorf("record %d (next %d), disk %s; want 2, 2", rec.Generation, rec.NextGeneration, s.onDisk())
	}
	if !strings.Contains(console.String(), "state disk generation 2 recorded by the join service at "+cp0) {
		t.Errorf("console:\n%s", console.String())
	}
}

// A disk admitted before generations: no file on the disk, none in the
// record. It is accepted once, and the count starts.
func TestDiskAdmittedBeforeGenerations(t *testing.T) {
	s := newService(t, admitted.Record{})
	if err := run(t, checker(s, joinServices{cp0: s}, &syncbuffer.Buffer{})); err != nil {
		t.Fatal(err)
	}
	if s.onDisk() != "1" || s.record().Generation != 1 {
		t.Fatalf("disk %s, record %d; want 1 and 1", s.onDisk(), s.record().Generation)
	}
	// A copy of the disk from before that rejoin is refused from now on.
	os.Remove(s.path)
	var older *OlderDiskError
	if err := run(t, checker(s, joinServices{cp0: s}, &syncbuffer.Buffer{})); !errors.As(err, &older) {
		t.Fatalf("a copy from before the first rejoin: err = %v, want an OlderDiskError", err)
	}
}

// An older copy is refused at once, with the join service's word, and
// nothing is written to it: however often the host boots it, it never
// catches up with the record.
func TestOlderDiskIsNotWritten(t *testing.T) {
	s := newService(t, admitted.Record{Generation: 5})
	if err := Write(s.path, 3); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		err := run(t, checker(s, joinServices{cp0: s, cp1: s}, &syncbuffer.Buffer{}))
		var older *OlderDiskError
		if !errors.As(err, &older) || older.Addr != cp0 {
			t.Fatalf("err = %v, want an OlderDiskError from %s", err, cp0)
		}
		for _, want := range []string{"presents generation 3 but the cluster recorded 5", "orrery node remove"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v\ndoes not say %q", err, want)
			}
		}
	}
	if s.onDisk() != "3" {
		t.Errorf("the refused disk holds %s, want 3, untouched", s.onDisk())
	}
	if got := s.log(); strings.Contains(got, "record") {
		t.Errorf("a refused disk was recorded: %s", got)
	}
}

// Whatever step fails, a genuine disk gets through on a later round or
// boot: the next check accepts what the disk holds.
func TestFailuresDoNotLockOut(t *testing.T) {
	tests := map[string]func(s *service){
		"record lost":                 func(s *service) { s.failRecords = 2 },
		"record's answer lost":        func(s *service) { s.loseRecordAnswers = 2 },
		"both":                        func(s *service) { s.failRecords, s.loseRecordAnswers = 1, 1 },
		"next not above the disk's":   func(s *service) { s.badNext = 1 },
		"next past what is issued":    func(s *service) { s.badNext = admitted.MaxGeneration + 1 },
		"recorded before, disk ahead": func(s *service) { s.rec.NextGeneration = 4 },
	}
	for name, fail := range tests {
		t.Run(name, func(t *testing.T) {
			s := newService(t, admitted.Record{Generation: 3})
			if err := Write(s.path, 3); err != nil {
				t.Fatal(err)
			}
			fail(s)
			if err := run(t, checker(s, joinServices{cp0: s}, &syncbuffer.Buffer{})); err != nil {
				t.Fatalf("%v (calls: %s)", err, s.log())
			}
			rec := s.record()
			if fmt.Sprint(rec.Generation) != s.onDisk() || rec.NextGeneration != 0 {
				t.Fatalf("record %d (next %d), disk %s: want them equal, nothing pending (calls: %s)", rec.Generation, rec.NextGeneration, s.onDisk(), s.log())
			}
		})
	}
}

// A boot that stops between the write and the record (power cut, ctx
// ended) leaves a disk the next boot's check accepts.
func TestStoppedBootLeavesADiskTheNextAccepts(t *testing.T) {
	s := newService(t, admitted.Record{})
	s.failRecords = 1
	c := checker(s, joinServices{cp0: s}, &syncbuffer.Buffer{})
	c.Others = nil
	ctx, cancel := context.WithCancel(context.Background())
	c.Say = func(string, ...any) { cancel() } // the first failed round ends the boot
	if err := c.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the boot stopped", err)
	}
	if s.onDisk() != "1" || s.record().Generation != 0 {
		t.Fatalf("after the stop: disk %s, record %d; want 1 written, 0 recorded", s.onDisk(), s.record().Generation)
	}
	if err := run(t, checker(s, joinServices{cp0: s}, &syncbuffer.Buffer{})); err != nil {
		t.Fatal(err)
	}
	if s.onDisk() != "2" || s.record().Generation != 2 {
		t.Fatalf("the next boot: disk %s, record %d; want 2 and 2", s.onDisk(), s.record().Generation)
	}
}

func TestAsksTheOtherControlPlanes(t *testing.T) {
	s := newService(t, admitted.Record{})
	var console syncbuffer.Buffer
	// The control plane that gave the ticket went down since.
	if err := run(t, checker(s, joinServices{cp1: s}, &console)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(console.String(), "recorded by the join service at "+cp1) {
		t.Errorf("console:\n%s", console.String())
	}
}

// A join service older than the check records no generation: the node
// boots on, saying so, and writes nothing. A newer one beside it is
// asked, and then used.
func TestOlderJoinService(t *testing.T) {
	old := newService(t, admitted.Record{})
	old.unimplemented = true
	var console syncbuffer.Buffer
	if err := run(t, checker(old, joinServices{cp0: old}, &console)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(console.String(), "WARNING: the control planes run a join service older than the disk generation check") {
		t.Errorf("console:\n%s", console.String())
	}
	if old.onDisk() != "none" {
		t.Errorf("the disk holds %s, want nothing written", old.onDisk())
	}
	current := newService(t, admitted.Record{})
	current.path = old.path
	console = syncbuffer.Buffer{}
	if err := run(t, checker(old, joinServices{cp0: old, cp1: current}, &console)); err != nil {
		t.Fatalf("%v\n%s\nold: %s\ncurrent: %s", err, console.String(), old.log(), current.log())
	}
	if current.record().Generation != 1 || old.onDisk() != "1" {
		t.Errorf("with a current join service beside the old one: record %d, disk %s; want 1 and 1", current.record().Generation, old.onDisk())
	}
}

// A generation file that is not one (root on the node wrote it, or the
// disk is damaged) stops the boot before any join service is asked.
func TestUnreadableGenerationStops(t *testing.T) {
	s := newService(t, admitted.Record{Generation: 4})
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.path, []byte("4 or so\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(t, checker(s, joinServices{cp0: s}, &syncbuffer.Buffer{}))
	if err == nil || !strings.Contains(err.Error(), "is not a generation") || !strings.Contains(err.Error(), "orrery node remove") {
		t.Fatalf("err = %v, want the file refused with what to do", err)
	}
	if s.log() != "" {
		t.Errorf("a join service was asked: %s", s.log())
	}
}
