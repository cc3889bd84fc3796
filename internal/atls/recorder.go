package atls

import (
	"context"
	"errors"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// Recorder wraps a client's attested-TLS credentials and keeps the outcome
// of their last handshake. gRPC reports a failed handshake only as text
// inside an Unavailable status; a caller must tell a peer that failed to
// prove itself, or refused this client, from one that is down or
// unreachable, which is worth a retry.
type Recorder struct {
	credentials.TransportCredentials
	mu   sync.Mutex
	last error
}

// NewRecorder returns creds, recording their handshakes.
func NewRecorder(creds credentials.TransportCredentials) *Recorder {
	return &Recorder{TransportCredentials: creds}
}

// ClientHandshake implements credentials.TransportCredentials.
func (r *Recorder) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := r.TransportCredentials.ClientHandshake(ctx, authority, raw)
	r.mu.Lock()
	r.last = err
	r.mu.Unlock()
	return conn, info, err
}

// Clone keeps one record for every connection gRPC makes from a clone.
func (r *Recorder) Clone() credentials.TransportCredentials { return r }

// Refusal returns the last handshake's error if the peer's attestation
// was rejected (*RejectedError) or the peer ended the handshake with a
// reason (*ServerEndedError), and nil if it succeeded or failed otherwise.
func (r *Recorder) Refusal() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rejected *RejectedError
	var ended *ServerEndedError
	if errors.As(r.last, &rejected) || errors.As(r.last, &ended) {
		return r.last
	}
	return nil
}
