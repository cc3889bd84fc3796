// Package atlstest serves gRPC over attested TLS for tests: a fake node, a
// fake join service or a recovery server, on a loopback port.
package atlstest

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// Serve starts a gRPC server with attested-TLS credentials from cfg (and
// opts), lets register add its services, and returns its address. The
// server stops when the test ends.
func Serve(tb testing.TB, cfg atls.Config, register func(*grpc.Server), opts ...grpc.ServerOption) string {
	tb.Helper()
	return ServeAt(tb, "127.0.0.1:0", cfg, register, opts...)
}

// ServeAt is Serve on listen (HOST:PORT): for a test whose client dials a
// fixed port, as the owner's commands dial a node's.
func ServeAt(tb testing.TB, listen string, cfg atls.Config, register func(*grpc.Server), opts ...grpc.ServerOption) string {
	tb.Helper()
	creds, err := atls.NewCredentials(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(creds)}, opts...)...)
	register(srv)
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(lis)
	tb.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// SlowIssuer attests after Delay, as a node or join service does on a
// starved VM, or a node service that systemd starts on the first
// connection.
type SlowIssuer struct {
	attestation.Issuer
	Delay time.Duration
}

// Issue waits Delay, then issues.
func (s SlowIssuer) Issue(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	select {
	case <-time.After(s.Delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Issuer.Issue(ctx, userData, nonce)
}
