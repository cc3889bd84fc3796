package initserver

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/statuslimit"
)

// transportLimit is the largest message bootstrapperd's gRPC server
// takes: gRPC's default MaxRecvMsgSize, as bootstrapperd/run.go sets
// none.
const transportLimit = 4 << 20

// cheap is what a refused request may cost the handler at most: a bcrypt
// comparison (about 4 KiB of cipher state) and an error, with room.
const cheap = 64 << 10

// huge returns request(1) changed by mutate.
func huge(mutate func(*initpb.InitRequest)) *initpb.InitRequest {
	req := request(1)
	mutate(req)
	return req
}

func wrongSecret(r *initpb.InitRequest) { r.InitSecret = []byte("guess") }

func clusterName(n int) func(*initpb.InitRequest) {
	return func(r *initpb.InitRequest) { r.ClusterName = strings.Repeat("A", n) }
}

// sans gives the request n bad SANs.
func sans(n int) func(*initpb.InitRequest) {
	return func(r *initpb.InitRequest) {
		r.ApiServerCertSans = make([]string, n)
		for i := range r.ApiServerCertSans {
			r.ApiServerCertSans[i] = "not a name"
		}
	}
}

// atLimit grows the cluster name until the request is size bytes on the
// wire.
func atLimit(size int) func(*initpb.InitRequest) {
	return func(r *initpb.InitRequest) {
		for range 4 { // the name's length prefix changes with it
			if d := size - proto.Size(r); d >= 0 {
				r.ClusterName += strings.Repeat("A", d)
			} else {
				r.ClusterName = r.ClusterName[:len(r.ClusterName)+d]
			}
		}
	}
}

func all(mutate ...func(*initpb.InitRequest)) func(*initpb.InitRequest) {
	return func(r *initpb.InitRequest) {
		for _, m := range mutate {
			m(r)
		}
	}
}

// refusal is a request the server refuses, and how.
type refusal struct {
	req      *initpb.InitRequest
	wantCode codes.Code
	wantMsg  string
}

// unauthenticated are requests from a peer that does not know the init
// secret, each as large as the transport lets it be in its own way.
func unauthenticated() map[string]refusal {
	return map[string]refusal{
		"wrong secret, 3 MiB cluster name": {huge(all(wrongSecret, clusterName(3<<20))), codes.PermissionDenied, "wrong init secret"},
		"wrong secret, 100000 SANs":        {huge(all(wrongSecret, sans(100000))), codes.PermissionDenied, "wrong init secret"},
		"wrong secret, at the transport limit": {
			huge(all(wrongSecret, sans(1000), atLimit(transportLimit-1))), codes.PermissionDenied, "wrong init secret",
		},
		"no secret, 3 MiB cluster name":   {huge(all(func(r *initpb.InitRequest) { r.InitSecret = nil }, clusterName(3<<20))), codes.InvalidArgument, "init secret has 0 bytes"},
		"3 MiB secret":                    {huge(func(r *initpb.InitRequest) { r.InitSecret = make([]byte, 3<<20) }), codes.InvalidArgument, "init secret has 3145728 bytes, want 1 to 72"},
		"73-byte secret, 100000 SANs":     {huge(all(func(r *initpb.InitRequest) { r.InitSecret = make([]byte, 73) }, sans(100000))), codes.InvalidArgument, "init secret has 73 bytes"},
		"wrong secret, otherwise correct": {huge(wrongSecret), codes.PermissionDenied, "wrong init secret"},
	}
}

func TestUnauthenticatedRequestsAreRefusedFirst(t *testing.T) {
	var checked atomic.Int32
	e := newEnv(t, func(c *Config) {
		supported := c.Supported
		c.Supported = func(v string) error { checked.Add(1); return supported(v) }
	})
	for name, tc := range unauthenticated() {
		t.Run(name, func(t *testing.T) {
			if n := proto.Size(tc.req); n >= transportLimit {
				t.Fatalf("the request has %d bytes: the transport refuses it before the server sees it", n)
			}
			msgs, err := e.collect(context.Background(), tc.req)
			st := status.Convert(err)
			if st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("status %v %.200q, want %v containing %q", st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
			}
			if len(msgs) != 0 || len(st.Message()) > 200 {
				t.Fatalf("reply of %d messages and a %d-byte error, want none and a short one", len(msgs), len(st.Message()))
			}
		})
	}
	if n := checked.Load(); n != 0 {
		t.Fatalf("validate checked the Kubernetes version of %d requests that did not prove the init secret", n)
	}
}

// TestRefusedRequestsAllocateLittle measures what the handler allocates
// for a refused request of a few MiB: gRPC itself has allocated the
// request by then; the handler must not add anything that grows with it.
func TestRefusedRequestsAllocateLittle(t *testing.T) {
	s := directServer(t)
	tests := unauthenticated()
	tests["right secret, 3 MiB cluster name"] = refusal{huge(clusterName(3 << 20)), codes.InvalidArgument, "cluster name"}
	tests["right secret, 100000 SANs"] = refusal{huge(sans(100000)), codes.InvalidArgument, "API server SANs"}
	tests["right secret, every field too big"] = refusal{huge(everyFieldTooBig), codes.InvalidArgument, "service CIDR"}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n, err := allocated(func() error { return s.Init(tc.req, fakeStream{}) })
			if status.Code(err) != tc.wantCode {
				t.Fatalf("status %v, want %v", err, tc.wantCode)
			}
			t.Logf("%d-byte request: the handler allocated %d bytes", proto.Size(tc.req), n)
			if n > cheap {
				t.Fatalf("the handler allocated %d bytes to refuse a %d-byte request, want at most %d", n, proto.Size(tc.req), cheap)
			}
		})
	}
}

func TestOversizedFieldsGetBoundedErrors(t *testing.T) {
	e := newEnv(t)
	tests := map[string]struct {
		mutate  func(*initpb.InitRequest)
		wantMsg []string
	}{
		"3 MiB cluster name":   {clusterName(3 << 20), []string{`cluster name "AAAA`, "... (3145728 bytes) is not a DNS label"}},
		"64-byte cluster name": {clusterName(64), []string{"cluster name", "at most 63"}},
		"100000 SANs":          {sans(100000), []string{"100000 API server SANs, at most 64"}},
		"65 good SANs": {func(r *initpb.InitRequest) {
			r.ApiServerCertSans = make([]string, 65)
			fill(r.ApiServerCertSans, "api.example.org")
		}, []string{"65 API server SANs, at most 64"}},
		"64 bad SANs":              {sans(64), []string{"64 of 64 are not", "and 61 more"}},
		"254-byte SAN":             {func(r *initpb.InitRequest) { r.ApiServerCertSans = []string{strings.Repeat("a", 254)} }, []string{"1 of 1 are not", "... (254 bytes)"}},
		"3 MiB SAN":                {func(r *initpb.InitRequest) { r.ApiServerCertSans = []string{strings.Repeat("a", 3<<20)} }, []string{"... (3145728 bytes)"}},
		"3 MiB Kubernetes version": {func(r *initpb.InitRequest) { r.KubernetesVersion = strings.Repeat("v", 3<<20) }, []string{"Kubernetes version", "longer than 32 bytes"}},
		"3 MiB service CIDR":       {func(r *initpb.InitRequest) { r.ServiceCidr = strings.Repeat("1", 3<<20) }, []string{"service CIDR", "longer than 64 bytes"}},
		"3 MiB endpoint":           {func(r *initpb.InitRequest) { r.ControlPlaneEndpoint = strings.Repeat("1", 3<<20) }, []string{"control-plane endpoint", "... (3145728 bytes)"}},
		"3 MiB master secret":      {func(r *initpb.InitRequest) { r.MasterSecret = make([]byte, 3<<20) }, []string{"master key has 3145728 bytes, want 32"}},
		"3 MiB master secret salt": {func(r *initpb.InitRequest) { r.MasterSecretSalt = make([]byte, 3<<20) }, []string{"master salt has 3145728 bytes, want 32"}},
		"3 MiB measurement salt":   {func(r *initpb.InitRequest) { r.MeasurementSalt = make([]byte, 3<<20) }, []string{"measurement salt has 3145728 bytes, want 32"}},
		"every field too big, at the transport limit": {
			everyFieldTooBig,
			[]string{"master key", "measurement salt", "Kubernetes version", "cluster name", "API server SANs", "service CIDR"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := huge(tc.mutate)
			msgs, err := e.collect(context.Background(), req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || len(msgs) != 0 {
				t.Fatalf("status %v %.200q and %d messages, want InvalidArgument and none", st.Code(), st.Message(), len(msgs))
			}
			for _, want := range tc.wantMsg {
				if !strings.Contains(st.Message(), want) {
					t.Errorf("error %q does not say %q", st.Message(), want)
				}
			}
			t.Logf("%d-byte request: %d-byte error", proto.Size(req), len(st.Message()))
			if len(st.Message()) > statuslimit.MaxMessage {
				t.Errorf("the error has %d bytes, want at most %d", len(st.Message()), statuslimit.MaxMessage)
			}
		})
	}
	if e.cluster.inits != 0 || len(e.disk.rekeys) != 0 {
		t.Fatal("a refused request changed the node")
	}
}

// everyFieldTooBig makes every field of a request too big, up to just
// under the transport's limit.
func everyFieldTooBig(r *initpb.InitRequest) {
	r.MasterSecret, r.MasterSecretSalt, r.MeasurementSalt = make([]byte, 1<<20), make([]byte, 1<<10), make([]byte, 1<<10)
	r.KubernetesVersion, r.ServiceCidr = strings.Repeat("v", 1<<20), strings.Repeat("1", 1<<20)
	r.ApiServerCertSans = make([]string, maxSANs)
	fill(r.ApiServerCertSans, strings.Repeat("€", 4<<10))
	atLimit(transportLimit - 1)(r)
}

// TestLargestValidRequestFits checks MaxRequestSize against a request
// with every field at its limit.
func TestLargestValidRequestFits(t *testing.T) {
	req := request(1)
	req.KubernetesVersion = "v1.36.3-" + strings.Repeat("a", maxVersion-8)
	req.InitSecret = make([]byte, maxInitSecret)
	req.ClusterName = strings.Repeat("a", maxClusterName)
	req.ApiServerCertSans = make([]string, maxSANs)
	fill(req.ApiServerCertSans, strings.Repeat(strings.Repeat("a", 63)+".", 3)+strings.Repeat("a", 61))
	// As long as a valid range gets: the services' range is IPv4.
	req.ServiceCidr = "172.100.100.128/25"
	req.ControlPlaneEndpoint = strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 61) + ":65535"
	if err := validate(req, func(string) error { return nil }); err != nil {
		t.Fatalf("validate: %v", err)
	}
	n := proto.Size(req)
	if n > MaxRequestSize {
		t.Fatalf("the largest valid request has %d bytes, MaxRequestSize is %d", n, MaxRequestSize)
	}
	t.Logf("the largest valid request has %d bytes", n)
}

// TestInitSecretChecksRunOneAtATime holds one check while nine more
// requests arrive.
func TestInitSecretChecksRunOneAtATime(t *testing.T) {
	s := directServer(t)
	s.secretWait = 50 * time.Millisecond
	hash := s.cfg.InitSecretHash
	var running, most atomic.Int32
	release := make(chan struct{})
	s.cfg.InitSecretHash = func(ctx context.Context) ([]byte, error) {
		n := running.Add(1)
		defer running.Add(-1)
		if n > most.Load() {
			most.Store(n)
		}
		<-release
		return hash(ctx)
	}
	errs := make(chan error)
	for range 10 {
		go func() { errs <- s.Init(huge(wrongSecret), fakeStream{}) }()
	}
	// Nine give up waiting while the first check is held, then it ends.
	codesSeen := map[codes.Code]int{}
	for i := range 10 {
		if i == 9 {
			close(release)
		}
		select {
		case err := <-errs:
			codesSeen[status.Code(err)]++
		case <-time.After(10 * time.Second):
			t.Fatalf("after %d answers, statuses %v: the others hang", i, codesSeen)
		}
	}
	if most.Load() != 1 || codesSeen[codes.PermissionDenied] != 1 || codesSeen[codes.Unavailable] != 9 {
		t.Fatalf("%d checks ran at once, statuses %v; want 1, one PermissionDenied and nine Unavailable", most.Load(), codesSeen)
	}
}

func BenchmarkRefusedRequest(b *testing.B) {
	s := directServer(b)
	for name, tc := range unauthenticated() {
		b.Run(strings.ReplaceAll(name, " ", "_"), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Init(tc.req, fakeStream{}); status.Code(err) != tc.wantCode {
					b.Fatal(err)
				}
			}
		})
	}
}

// directServer is a server whose Init a test calls without gRPC, with the
// cheapest bcrypt cost.
func directServer(tb testing.TB) *Server {
	tb.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(initSecret), bcrypt.MinCost)
	if err != nil {
		tb.Fatal(err)
	}
	return New(Config{
		InitSecretHash: func(context.Context) ([]byte, error) { return hash, nil },
		Supported:      func(string) error { return nil },
	})
}

// fakeStream is the stream of a direct call; nothing is sent on it before
// the request is accepted.
type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }

func (fakeStream) Send(*initpb.InitResponse) error {
	return errors.New("fakeStream: no sends expected")
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

func fill(s []string, v string) {
	for i := range s {
		s[i] = v
	}
}

// BenchmarkRefusedRequestOverGRPC sends a pre-encoded request of just
// under the transport's limit to a server as bootstrapperd/run.go makes
// it today (gRPC's default limit) and to ones limited to MaxRequestSize.
// The bytes per op are the test process's, client and server: the
// client's share is small, as the request is encoded once, before.
func BenchmarkRefusedRequestOverGRPC(b *testing.B) {
	raw, err := proto.Marshal(huge(all(wrongSecret, atLimit(transportLimit-1))))
	if err != nil {
		b.Fatal(err)
	}
	for name, opts := range map[string][]grpc.ServerOption{
		"default_limit":        nil,
		"limit_MaxRequestSize": {grpc.MaxRecvMsgSize(MaxRequestSize)},
		// A fixed window stops the client from sending more than 64 KiB
		// that the server must read and drop after refusing.
		"limit_and_fixed_window": {grpc.MaxRecvMsgSize(MaxRequestSize), grpc.InitialWindowSize(64 << 10), grpc.InitialConnWindowSize(64 << 10)},
	} {
		b.Run(name, func(b *testing.B) {
			conn := serveDirect(b, directServer(b), opts...)
			b.ReportAllocs()
			for b.Loop() {
				err := sendRaw(conn, raw)
				if c := status.Code(err); c != codes.PermissionDenied && c != codes.ResourceExhausted {
					b.Fatal(err)
				}
			}
		})
	}
}

// serveDirect serves s over gRPC on a loopback port.
func serveDirect(tb testing.TB, s *Server, opts ...grpc.ServerOption) *grpc.ClientConn {
	tb.Helper()
	g := grpc.NewServer(opts...)
	initpb.RegisterInitServiceServer(g, s)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go g.Serve(lis)
	tb.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// sendRaw calls Init with an encoded request and returns its status.
func sendRaw(conn *grpc.ClientConn, raw []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	desc := &initpb.InitService_ServiceDesc.Streams[0]
	stream, err := conn.NewStream(ctx, desc, initpb.InitService_Init_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}
	if err := stream.SendMsg(raw); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	return stream.RecvMsg(&initpb.InitResponse{})
}

// rawCodec sends []byte as it is and decodes replies as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

// The node's own check (CheckNode: in bootstrapperd, a question to the
// metadata service) runs only for a request that proved the init secret
// and passed validation, and its refusal reaches the owner before
// anything changes.
func TestCheckNodeOnlyAfterTheInitSecret(t *testing.T) {
	var checked atomic.Int32
	s := directServer(t)
	s.cfg.CheckNode = func(context.Context) error {
		checked.Add(1)
		return status.Error(codes.FailedPrecondition, "not this node")
	}
	for name, mutate := range map[string]func(*initpb.InitRequest){
		"wrong secret":                   wrongSecret,
		"no secret":                      func(r *initpb.InitRequest) { r.InitSecret = nil },
		"invalid, with the right secret": clusterName(100),
	} {
		req := request(1)
		mutate(req)
		if err := s.Init(req, fakeStream{}); status.Code(err) == codes.FailedPrecondition {
			t.Errorf("%s: the node's check ran: %v", name, err)
		}
	}
	if n := checked.Load(); n != 0 {
		t.Fatalf("the node's check ran %d times for requests that proved nothing or were invalid", n)
	}
	if err := s.Init(request(1), fakeStream{}); status.Code(err) != codes.FailedPrecondition || checked.Load() != 1 {
		t.Fatalf("a good request: %v after %d checks, want the check's refusal", err, checked.Load())
	}
}
