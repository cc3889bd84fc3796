// Package dialer connects the owner's commands to a node over attested TLS:
// the node attests, and the owner checks it against the image's
// measurements before a byte of any request leaves. Every owner command
// (init, verify, recover) dials through it, so that they all check the same
// way and wait for a booting node the same way.
package dialer

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// Dialer opens connections to nodes whose attestation a validator accepts.
type Dialer struct {
	creds *atls.Recorder
	// handshakeTimeout bounds one probe in WaitAttested, and a
	// connection's attempt to connect and attest.
	handshakeTimeout time.Duration
	// retryEvery is the pause between WaitAttested's attempts.
	retryEvery time.Duration
	// RefusedGrace is how long WaitAttested takes refused connections
	// for a service about to start; zero waits as long as its context.
	RefusedGrace time.Duration
}

// refusedGrace covers a node whose network came up a moment before the
// socket of the service asked for: systemd opens the sockets early in
// boot, and the initrd serves as soon as its network is up, so a port
// refused for longer has nothing starting behind it.
const refusedGrace = 15 * time.Second

// New returns a Dialer that accepts a node only if v accepts its
// attestation.
func New(v attestation.Validator) (*Dialer, error) { return NewAs(nil, v) }

// NewAs returns a Dialer that proves key to the node (the owner's access
// key, for the inspect service) and accepts a node only if one of vs accepts
// its attestation. A nil key proves a fresh one per connection.
func NewAs(key crypto.Signer, vs ...attestation.Validator) (*Dialer, error) {
	creds, err := atls.NewCredentials(atls.Config{Validators: vs, ClientKey: key})
	if err != nil {
		return nil, err
	}
	return &Dialer{creds: atls.NewRecorder(creds), handshakeTimeout: 2 * time.Minute, retryEvery: 2 * time.Second, RefusedGrace: refusedGrace}, nil
}

// HandshakeError turns err, a call's error on a connection of d, into a
// *NotAttestedError if the node's attestation was refused, or into the
// node's own reason if it ended the handshake; other errors stay as
// they are.
func (d *Dialer) HandshakeError(addr string, err error) error {
	last := d.creds.Refusal()
	var rejected *atls.RejectedError
	var ended *atls.ServerEndedError
	switch {
	case errors.As(last, &rejected):
		return &NotAttestedError{Addr: addr, Err: rejected.Err}
	case errors.As(last, &ended):
		return fmt.Errorf("the node at %s refused this client: %s", addr, ended.Reason)
	}
	return err
}

// Conn returns a gRPC connection to addr (HOST:PORT). It connects lazily:
// the node's attestation is checked on the first call, which fails with
// an *atls.RejectedError inside its status if the node does not pass.
// The call's context bounds the call, and atls the handshake; gRPC's own
// shorter connect deadline is lifted (a node service that systemd starts
// on the first connection is slow to answer it).
func (d *Dialer) Conn(addr string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(d.creds), atls.HandshakeWithin(d.handshakeTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return conn, nil
}

// NothingListensError says that a machine answers at the node's address
// but refuses the connection, and has for a while: no Orrery service is
// starting there.
type NothingListensError struct {
	Addr string
	For  time.Duration
}

func (e *NothingListensError) Error() string {
	return fmt.Sprintf("nothing listens on %s (connections refused for %s): is the VM up and is this its address? 'orrery mini status' lists the local cloud's VMs", e.Addr, e.For.Round(time.Second))
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
// *NotAttestedError, a server that is not an Orrery node with an
// *atls.NotATLSError, and an address that keeps refusing connections
// with a *NothingListensError.
func (d *Dialer) WaitAttested(ctx context.Context, addr string, onRetry func(attempt int, err error) error) error {
	var nd net.Dialer
	var refusedSince time.Time
	for attempt := 1; ; attempt++ {
		err := d.probe(ctx, &nd, addr)
		if err == nil {
			return nil
		}
		var rejected *atls.RejectedError
		if errors.As(err, &rejected) {
			return &NotAttestedError{Addr: addr, Err: rejected.Err}
		}
		var other *atls.NotATLSError
		if errors.As(err, &other) {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the node at %s did not answer in time: %v", addr, err)
		}
		if onRetry != nil {
			if err := onRetry(attempt, err); err != nil {
				return err
			}
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			refusedSince = time.Time{}
		} else if refusedSince.IsZero() {
			refusedSince = time.Now()
		} else if d.RefusedGrace > 0 && time.Since(refusedSince) >= d.RefusedGrace {
			return &NothingListensError{Addr: addr, For: time.Since(refusedSince)}
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
	tlsConn, _, err := d.creds.TransportCredentials.Clone().ClientHandshake(hctx, addr, conn)
	if err != nil {
		conn.Close()
		return err
	}
	return tlsConn.Close()
}
