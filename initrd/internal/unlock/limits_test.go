package unlock

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
	"github.com/orrery-dev/orrery/internal/statuslimit"
)

// transportLimit is the largest request the recovery server takes:
// initrd/init serves it with grpc.MaxRecvMsgSize(4096), as serveRecovery
// does.
const transportLimit = 4096

// stubLUKS answers for a disk that is not there.
type stubLUKS struct {
	testKey func(ctx context.Context) (bool, error)
	tests   atomic.Int32
}

func (l *stubLUKS) SaveHeader(context.Context, string, string, cryptsetup.Header) (cryptsetup.Volume, error) {
	return cryptsetup.Volume{}, nil
}

func (l *stubLUKS) TestKeyWithHeader(ctx context.Context, _, _, _ string) (bool, error) {
	l.tests.Add(1)
	return l.testKey(ctx)
}

func (l *stubLUKS) OpenChecked(context.Context, string, string, string, string, cryptsetup.Header) error {
	return nil
}

func stubServer(t testing.TB, testKey func(context.Context) (bool, error)) (*RecoverServer, *stubLUKS) {
	luks := &stubLUKS{testKey: testKey}
	u := &Unlocker{LUKS: luks, Device: "/dev/vdb", MapperName: "state", KeyDir: t.TempDir()}
	return &RecoverServer{DiskUUID: diskUUID, Unlocker: u, Say: func(string, ...any) {}}, luks
}

// largest is a recovery request of exactly size bytes on the wire.
func largest(size int) *recoverpb.RecoverRequest {
	req := &recoverpb.RecoverRequest{MasterSecretSalt: make([]byte, 32)}
	for range 3 { // the key's length prefix changes with it
		req.MasterSecret = make([]byte, len(req.MasterSecret)+size-proto.Size(req))
	}
	return req
}

func TestRecoverRepliesAreBounded(t *testing.T) {
	longOutput := errors.New(strings.Repeat("cryptsetup: ", 1<<20/12))
	tests := map[string]struct {
		req      *recoverpb.RecoverRequest
		testKey  func(context.Context) (bool, error)
		wantCode codes.Code
		wantMsg  string
		tried    bool
	}{
		"largest request the transport allows": {
			req: largest(transportLimit), wantCode: codes.InvalidArgument, wantMsg: "master key has 4059 bytes, want 32",
		},
		"wrong master secret": {
			req: withCluster(t, masterSecret(t)), testKey: func(context.Context) (bool, error) { return false, nil },
			wantCode: codes.PermissionDenied, wantMsg: "does not open the node's state disk", tried: true,
		},
		"cryptsetup fails with 1 MiB of output": {
			req: withCluster(t, masterSecret(t)), testKey: func(context.Context) (bool, error) { return false, longOutput },
			wantCode: codes.Internal, wantMsg: "open the state disk: try the key on /dev/vdb: cryptsetup: ", tried: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, luks := stubServer(t, tc.testKey)
			n, err := allocated(func() error { _, err := s.Recover(context.Background(), tc.req); return err })
			st := status.Convert(err)
			if st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) || len(st.Message()) > statuslimit.MaxMessage {
				t.Fatalf("status %v %.200q (%d bytes), want %v containing %q, at most %d bytes", st.Code(), st.Message(), len(st.Message()), tc.wantCode, tc.wantMsg, statuslimit.MaxMessage)
			}
			if tried := luks.tests.Load() != 0; tried != tc.tried {
				t.Fatalf("the key was tried on the disk: %v, want %v", tried, tc.tried)
			}
			// The node's own output can be long: formatting it costs
			// memory, but none of it comes from the peer.
			t.Logf("%d-byte request: the server allocated %d bytes, replied %d bytes", proto.Size(tc.req), n, len(st.Message()))
		})
	}
}

// TestRecoverTriesOneKeyAtATime holds one recovery on the disk and sends
// more.
func TestRecoverTriesOneKeyAtATime(t *testing.T) {
	release := make(chan struct{})
	s, luks := stubServer(t, func(ctx context.Context) (bool, error) {
		<-release
		return false, nil
	})
	s.busyWait = 50 * time.Millisecond
	ms := masterSecret(t)
	errs := make(chan error)
	for range 10 {
		go func() {
			_, err := s.Recover(context.Background(), withCluster(t, ms))
			errs <- err
		}()
	}
	// Nine give up waiting while the first key is on the disk, then it
	// ends.
	seen := map[codes.Code]int{}
	for i := range 10 {
		if i == 9 {
			close(release)
		}
		select {
		case err := <-errs:
			seen[status.Code(err)]++
		case <-time.After(10 * time.Second):
			t.Fatalf("after %d answers, statuses %v: the others hang", i, seen)
		}
	}
	if luks.tests.Load() != 1 || seen[codes.PermissionDenied] != 1 || seen[codes.Unavailable] != 9 {
		t.Fatalf("%d keys tried, statuses %v; want 1, one PermissionDenied and nine Unavailable", luks.tests.Load(), seen)
	}
}

// TestRecoverRefusesTheLargestRequestCheaply sends, over attested TLS,
// the largest request the transport takes.
func TestRecoverRefusesTheLargestRequestCheaply(t *testing.T) {
	ms := masterSecret(t)
	node, u, luks, _, addr := recoveryNode(t, ms)
	conn := dialRecovery(t, node, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tests := map[string]struct {
		req      *recoverpb.RecoverRequest
		wantCode codes.Code
	}{
		"at the limit":      {largest(transportLimit), codes.InvalidArgument},
		"one byte over":     {largest(transportLimit + 1), codes.ResourceExhausted},
		"salt at the limit": {&recoverpb.RecoverRequest{MasterSecret: ms.Key, MasterSecretSalt: bytes.Repeat([]byte{1}, transportLimit-37)}, codes.InvalidArgument},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := recoverpb.NewRecoverServiceClient(conn).Recover(ctx, tc.req)
			st := status.Convert(err)
			if st.Code() != tc.wantCode || len(st.Message()) > 200 {
				t.Fatalf("a %d-byte request: %v %.200q, want %v and a short error", proto.Size(tc.req), st.Code(), st.Message(), tc.wantCode)
			}
		})
	}
	if isOpen(u) || luks.keyTests() != 0 {
		t.Error("a malformed request reached the disk")
	}
}

// allocated returns how many bytes f allocates, after one call to warm up.
func allocated(f func() error) (uint64, error) {
	_ = f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, err
}
