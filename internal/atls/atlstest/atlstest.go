// Package atlstest serves gRPC over attested TLS for tests: a fake node, a
// fake join service or a recovery server, on a loopback port.
package atlstest

import (
	"net"
	"testing"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
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
