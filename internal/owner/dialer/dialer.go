// Package dialer connects the owner's commands to a node over attested TLS:
// the node attests, and the owner checks it against the image's
// measurements before a byte of any request leaves. Every owner command
// (init, verify, recover) dials through it, so that they all check the same
// way and wait for a booting node the same way.
package dialer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// Dialer opens connections to nodes whose attestation a validator accepts.
type Dialer struct {
	creds credentials.TransportCredentials
	// handshakeTimeout bounds one probe in WaitAttested.
	handshakeTimeout time.Duration
	// retryEvery is the pause between WaitAttested's attempts.
	retryEvery time.Duration
}

// New returns a Dialer that accepts a node only if v accepts its
// attestation.
func New(v attestation.Validator) (*Dialer, error) {
	creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	if err != nil {
		return nil, err
	}
	return &Dialer{creds: creds, handshakeTimeout: 2 * time.Minute, retryEvery: 2 * time.Second}, nil
}

// Conn returns a gRPC connection to addr (HOST:PORT). It connects lazily:
// the node's attestation is checked on the first call, which fails with
// an *atls.RejectedError inside its status if the node does not pass.
func (d *Dialer) Conn(addr string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(d.creds))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return conn, nil
}

// Address adds port to node when node names no port of its own. The
// owner's flags take a host or a host:port.
func Address(node string, port int) string {
	if _, _, err := net.SplitHostPort(node); err == nil {
		return node
	}
	return net.JoinHostPort(node, strconv.Itoa(port))
}

// NotAttestedError says that the node answered but its attestation was
// refused: waiting cannot change what a node runs.
type NotAttestedError struct {
	Addr string
	Err  error
}

func (e *NotAttestedError) Error() string {
	return fmt.Sprintf("the node at %s is not running the expected image: %v", e.Addr, e.Err)
}

func (e *NotAttestedError) Unwrap() error { return e.Err }

// WaitAttested waits until the node at addr accepts a connection and
// passes its attestation once. While the node does not answer (it may
// still boot), it calls onRetry with the attempt's number and error and
// tries again every few seconds; onRetry ends the wait by returning an
// error, which WaitAttested returns. A node that answers with an
// attestation the validator refuses ends the wait at once with a
// *NotAttestedError.
func (d *Dialer) WaitAttested(ctx context.Context, addr string, onRetry func(attempt int, err error) error) error {
	var nd net.Dialer
	for attempt := 1; ; attempt++ {
		err := d.probe(ctx, &nd, addr)
		if err == nil {
			return nil
		}
		var rejected *atls.RejectedError
		if errors.As(err, &rejected) {
			return &NotAttestedError{Addr: addr, Err: rejected.Err}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the node at %s did not answer in time: %v", addr, err)
		}
		if onRetry != nil {
			if err := onRetry(attempt, err); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(d.retryEvery):
		}
	}
}

// probe connects to addr and runs one attested-TLS handshake.
func (d *Dialer) probe(ctx context.Context, nd *net.Dialer, addr string) error {
	conn, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, d.handshakeTimeout)
	defer cancel()
	tlsConn, _, err := d.creds.Clone().ClientHandshake(hctx, addr, conn)
	if err != nil {
		conn.Close()
		return err
	}
	return tlsConn.Close()
}
