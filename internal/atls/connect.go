package atls

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// HandshakeWithin lets a gRPC client's connection take up to d to connect
// and finish its attested handshake. Without it gRPC gives each attempt
// its MinConnectTimeout, 20 s, whatever the call's own deadline: a
// socket-activated node service on a 2-core machine under TCG took 23.6 s
// from its first connection to serving, so the owner's first call failed
// with "context deadline exceeded" though it had a minute left. The call's
// context still bounds the call.
func HandshakeWithin(d time.Duration) grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: d})
}
