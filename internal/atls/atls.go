// Package atls provides gRPC transport credentials for attested TLS: a TLS
// 1.3 connection after which one side (or both) proves with a remote
// attestation what it runs, bound to this very connection.
//
// Either side may attest, or both. The owner's CLI verifies a node it sends
// secrets to (the server attests: init, recover). On a join both do: the
// joining node verifies that the join service is a control plane of its
// own image before it sends its request or uses the answer (the server
// attests first), and the join service verifies the node before it hands
// out keys (then the client attests).
//
// After the TLS handshake, and before gRPC sees the connection, the two
// sides exchange four framed messages:
//
//	client -> server  hello:   nonce (if the client verifies), whether it attests
//	server -> client  reply:   its attestation (for the client's nonce), nonce (if it verifies)
//	client -> server  finish:  its verdict on the server, its attestation (for the server's nonce)
//	server -> client  verdict: its verdict on the client
//
// An attestation binds the verifier's fresh nonce, mixed with the TLS
// exporter secret of this connection (RFC 8446, section 7.5), and the
// attester's TLS public key as user data. A captured attestation is useless
// on any other connection (different exporter, different nonce), and an
// attestation relayed from another machine names a key the relay does not
// hold. TLS certificates are ephemeral and self-signed: the attestation,
// not a CA, is what makes the peer's key trustworthy.
//
// Until the exchange ends, a peer has proved nothing, so what it can make
// a server spend is bounded (see Config): each message has a size limit that
// fits its step and is allocated only as its bytes arrive, a server runs a
// limited number of handshakes at once, a client that does not send its
// hello soon is dropped, and quotes are issued a few at a time.
package atls

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// Defaults for Config's zero values.
const (
	// DefaultHandshakeTimeout bounds the TLS handshake and the
	// attestation exchange. Quoting on a vTPM of an emulated (TCG) VM
	// takes seconds, not milliseconds, and a handshake in which both
	// sides attest waits for two quotes.
	DefaultHandshakeTimeout = 60 * time.Second
	// DefaultHelloTimeout bounds a server's wait for a client's TLS
	// handshake and hello: a round trip or two, and no TPM work on the
	// client's side, so a client slower than this is stalling.
	DefaultHelloTimeout = 10 * time.Second
	// DefaultMaxHandshakes is far more than the nodes that join at once
	// in a cluster, and little memory (tens of kilobytes each).
	DefaultMaxHandshakes = 64
	// DefaultHandshakeQueueTimeout lets a client that arrives while every
	// slot is busy wait out a short burst instead of failing at once and
	// meeting gRPC's reconnect backoff, without piling up goroutines.
	DefaultHandshakeQueueTimeout = time.Second
	// DefaultMaxConcurrentQuotes is one: the TPM runs one command at a
	// time anyway, and between two quotes the node lock and init get
	// their turn at the TPM and the measurement log.
	DefaultMaxConcurrentQuotes = 1
	// DefaultMaxAttestationSize is over a hundred times a document from
	// swtpm (about 8 KiB, with a short measurement log and no firmware
	// log) and ten times a large firmware event log (tens of kilobytes).
	DefaultMaxAttestationSize = 1 << 20
)

// ErrTooManyHandshakes is returned by a server's handshake that found
// Config.MaxHandshakes handshakes in progress and as many connections
// waiting, or that waited longer than Config.HandshakeQueueTimeout.
var ErrTooManyHandshakes = errors.New("atls: too many handshakes in progress")

// Config says what this side of a connection proves and requires.
type Config struct {
	// Issuer, if set, makes this side attest itself when the peer asks.
	Issuer attestation.Issuer
	// Validators, if set, make this side require the peer to attest with
	// one of these variants. Empty means the peer need not attest.
	Validators []attestation.Validator
	// HandshakeTimeout bounds a whole handshake on either side: TLS, the
	// exchange, and any quote and validation. A client keeps its context's
	// deadline if that is earlier. Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// HelloTimeout bounds, on a server, the time from taking up a
	// connection to receiving the client's hello, TLS handshake included:
	// a client that connects and says nothing is dropped after it. Zero
	// means DefaultHelloTimeout.
	HelloTimeout time.Duration
	// MaxHandshakes caps the handshakes a server runs at once, and
	// separately the connections that wait for one of them: a waiting
	// connection that gets no slot within HandshakeQueueTimeout, and one
	// that finds the queue full, is closed with ErrTooManyHandshakes.
	// Zero means DefaultMaxHandshakes.
	MaxHandshakes int
	// HandshakeQueueTimeout is how long a connection waits for a
	// handshake slot. Zero means DefaultHandshakeQueueTimeout.
	HandshakeQueueTimeout time.Duration
	// MaxConcurrentQuotes caps the attestations this side issues at once,
	// across all connections that share these credentials; a handshake
	// waits for its turn within its HandshakeTimeout. Zero means
	// DefaultMaxConcurrentQuotes.
	MaxConcurrentQuotes int
	// MaxAttestationSize bounds, in bytes, the attestation document this
	// side accepts from a peer. Zero means DefaultMaxAttestationSize.
	MaxAttestationSize int
	// OnPeerRejected, if set, hears of every client whose attestation
	// or key this server refused. gRPC drops failed handshakes silently,
	// and an operator needs to see which node was turned away and why
	// (the error names the PCRs that differ).
	OnPeerRejected func(peer net.Addr, err error)
	// ClientKey, on a client, is the key it proves in the TLS handshake
	// instead of a fresh one per connection: a credential the server
	// checks with AuthorizeClient (the owner's access key). An
	// attesting client needs none: its attestation names its key.
	ClientKey crypto.Signer
	// AuthorizeClient, on a server, decides whether the client's key (the
	// TLS handshake proved the client holds it) may go on. It runs
	// before anything else the server does for the client, quotes
	// included; an error ends the exchange and is sent to the client.
	AuthorizeClient func(key crypto.PublicKey) error
}

// NewCredentials returns transport credentials for grpc.NewServer (with
// grpc.Creds) and grpc.NewClient (with grpc.WithTransportCredentials).
func NewCredentials(cfg Config) (credentials.TransportCredentials, error) {
	if cfg.Issuer == nil && len(cfg.Validators) == 0 {
		return nil, errors.New("atls: neither an issuer nor validators configured; use plain TLS for a connection nobody attests")
	}
	seen := map[variant.Variant]bool{}
	for _, v := range cfg.Validators {
		if seen[v.Variant()] {
			return nil, fmt.Errorf("atls: two validators for variant %s", v.Variant())
		}
		seen[v.Variant()] = true
	}
	if cfg.HandshakeTimeout < 0 || cfg.HelloTimeout < 0 || cfg.HandshakeQueueTimeout < 0 ||
		cfg.MaxHandshakes < 0 || cfg.MaxConcurrentQuotes < 0 || cfg.MaxAttestationSize < 0 {
		return nil, errors.New("atls: negative timeout or limit in Config; use zero for the default")
	}
	cfg.HandshakeTimeout = orDefault(cfg.HandshakeTimeout, DefaultHandshakeTimeout)
	cfg.HelloTimeout = orDefault(cfg.HelloTimeout, DefaultHelloTimeout)
	cfg.HandshakeQueueTimeout = orDefault(cfg.HandshakeQueueTimeout, DefaultHandshakeQueueTimeout)
	cfg.MaxHandshakes = orDefault(cfg.MaxHandshakes, DefaultMaxHandshakes)
	cfg.MaxConcurrentQuotes = orDefault(cfg.MaxConcurrentQuotes, DefaultMaxConcurrentQuotes)
	cfg.MaxAttestationSize = orDefault(cfg.MaxAttestationSize, DefaultMaxAttestationSize)
	return &creds{
		cfg:        cfg,
		handshakes: make(chan struct{}, cfg.MaxHandshakes),
		waiting:    make(chan struct{}, cfg.MaxHandshakes),
		quotes:     make(chan struct{}, cfg.MaxConcurrentQuotes),
	}, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// RejectedError is returned by the client handshake when the server's
// attestation does not pass: unlike a network error, retrying will not
// help until the server runs something else.
type RejectedError struct{ Err error }

func (e *RejectedError) Error() string {
	return "atls: server's attestation rejected: " + e.Err.Error()
}

func (e *RejectedError) Unwrap() error { return e.Err }

// ServerEndedError is returned by the client handshake when the server
// ended the exchange instead of answering the client's hello, with the
// reason it gave (for example, that it cannot attest). A client that
// required the server's attestation got none: the server proved nothing.
type ServerEndedError struct{ Reason string }

func (e *ServerEndedError) Error() string {
	return "atls: server ended the handshake: " + e.Reason
}

// NotATLSError is returned by the client handshake when the server
// answered with something that is not this protocol: a plain TCP or HTTP
// service, or a TLS server of another kind. Retrying does not help; the
// address is wrong.
type NotATLSError struct {
	// What says how the server differs: "does not speak TLS" or
	// "speaks TLS but not attested TLS".
	What string
	// Saw are the first bytes the server sent.
	Saw []byte
}

func (e *NotATLSError) Error() string {
	const hint = "this is not an Orrery node's attested TLS: is it the node's address and port?"
	if len(e.Saw) == 0 {
		return fmt.Sprintf("atls: the server %s; %s", e.What, hint)
	}
	saw := fmt.Sprintf("% x", e.Saw)
	if isText(e.Saw) {
		saw = strconv.Quote(string(e.Saw))
	}
	return fmt.Sprintf("atls: the server %s: it answered %s; %s", e.What, saw, hint)
}

// refusedALPN reports whether err is the server's TLS alert that it
// offers none of the client's ALPN protocols (RFC 7301). crypto/tls keeps
// a received alert's type unexported, so its text is all there is.
func refusedALPN(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && op.Err.Error() == "tls: no application protocol"
}

// frameTooLongError is a frame whose announced length is over its limit.
// Its header is kept: a peer that is not speaking this protocol shows
// itself there ("HTTP" is a 1.2 GB frame).
type frameTooLongError struct {
	header [4]byte
	size   int64
	step   string
	limit  int
}

func (e *frameTooLongError) Error() string {
	return fmt.Sprintf("atls: peer announced a %d-byte %s, more than the limit of %d", e.size, e.step, e.limit)
}

// isText reports whether b is printable ASCII, as the start of a text
// protocol's answer is.
func isText(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return len(b) > 0
}

// AuthInfo is what a gRPC handler learns about its peer (peer.FromContext).
type AuthInfo struct {
	credentials.CommonAuthInfo
	TLS tls.ConnectionState
	// PeerVariant is the variant the peer attested with; the zero value
	// if this side did not require an attestation.
	PeerVariant variant.Variant
	// PeerInstance is the machine the peer's platform certified, as the
	// validator that accepted the peer read it from the certificate of
	// the peer's attestation key (see attestation.ProofValidator).
	// The zero value if the peer did not attest, its validator does not
	// tell instances, or the certificate names none.
	PeerInstance attestation.Instance
	// PeerHardware is the peer's verified hardware report, for variants
	// rooted in a CPU vendor's keys; nil otherwise.
	PeerHardware []attestation.Field
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return "atls" }

type creds struct {
	cfg Config
	// handshakes, waiting and quotes hold a token per server handshake
	// in progress, per connection waiting for one, and per quote in
	// progress. Clones share them, so the caps hold for everything that
	// uses one set of credentials.
	handshakes chan struct{}
	waiting    chan struct{}
	quotes     chan struct{}
}

func (c *creds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "atls"}
}

func (c *creds) Clone() credentials.TransportCredentials { cp := *c; return &cp }

// OverrideServerName is deprecated in gRPC and meaningless here: the peer
// is identified by its attestation, not by a name.
func (c *creds) OverrideServerName(string) error { return nil }

func (c *creds) ClientHandshake(ctx context.Context, _ string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cert, err := selfSignedCert(c.cfg.ClientKey)
	if err != nil {
		return nil, nil, err
	}
	// gRPC always passes a deadline (its connect timeout: 20 s, or what
	// HandshakeWithin gives), so ours must cut it short rather than only
	// fill in a missing one.
	ctx, cancel := context.WithTimeout(ctx, c.cfg.HandshakeTimeout)
	defer cancel()
	d, _ := ctx.Deadline()
	raw.SetDeadline(d)
	defer raw.SetDeadline(time.Time{})
	conn := tls.Client(raw, &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
		// The peer's certificate is ephemeral and self-signed; the
		// attestation below is what authenticates its key.
		InsecureSkipVerify: true, //nolint:gosec // the peer proves itself by attestation, bound to this connection's key, not by a CA
	})
	info, err := c.clientExchange(ctx, conn, cert)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, info, nil
}

func (c *creds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	release, err := c.handshakeSlot()
	if err != nil {
		return nil, nil, err
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HandshakeTimeout)
	defer cancel()
	// Until its hello the client has done nothing costly for itself;
	// serverExchange lifts this shorter deadline once the hello is in.
	d, _ := ctx.Deadline()
	raw.SetDeadline(earliest(d, time.Now().Add(c.cfg.HelloTimeout)))
	defer raw.SetDeadline(time.Time{})
	cert, err := selfSignedCert(nil)
	if err != nil {
		return nil, nil, err
	}
	conn := tls.Server(raw, &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
		// Every client presents a key, attesting or not, so that an
		// attesting client's key is always part of the handshake.
		ClientAuth: tls.RequireAnyClientCert,
	})
	info, err := c.serverExchange(ctx, conn, cert)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, info, nil
}

// handshakeSlot waits briefly for one of the server's handshake slots; the
// caller must call release when its handshake ends. gRPC runs each
// accepted connection in its own goroutine, so the queue is bounded too:
// a flood is refused at once rather than parked.
func (c *creds) handshakeSlot() (release func(), err error) {
	release = func() { <-c.handshakes }
	select {
	case c.handshakes <- struct{}{}:
		return release, nil
	default:
	}
	select {
	case c.waiting <- struct{}{}:
		defer func() { <-c.waiting }()
	default:
		return nil, fmt.Errorf("%w (%d, and as many waiting); if honest clients see this, raise Config.MaxHandshakes", ErrTooManyHandshakes, c.cfg.MaxHandshakes)
	}
	t := time.NewTimer(c.cfg.HandshakeQueueTimeout)
	defer t.Stop()
	select {
	case c.handshakes <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, fmt.Errorf("%w (%d); if honest clients see this, raise Config.MaxHandshakes", ErrTooManyHandshakes, c.cfg.MaxHandshakes)
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// message is every frame of the exchange; each step uses some fields.
type message struct {
	// Nonce asks the receiver to attest for it.
	Nonce []byte `json:"nonce,omitempty"`
	// Attests says the sender can attest (hello only).
	Attests bool `json:"attests,omitempty"`
	// Variant is the OID of Attestation's variant.
	Variant string `json:"variant,omitempty"`
	// Attestation answers the receiver's nonce.
	Attestation []byte `json:"attestation,omitempty"`
	// Error is the sender's reason to end the exchange.
	Error string `json:"error,omitempty"`
}

const (
	nonceSize     = 32
	maxErrorLen   = 2048
	exporterLabel = "EXPORTER-orrery-atls-v1"
	// helloLimit fits a hello, a base64 nonce and a flag in JSON (about
	// 80 bytes), with room for a field or two more.
	helloLimit = 1 << 10
	// envelopeLimit fits all of a message but its attestation: a nonce,
	// a variant OID, and an error of maxErrorLen bytes that JSON may
	// escape to six bytes each (\u00XX).
	envelopeLimit = 6*(maxErrorLen+8) + 1<<10
)

// attestationLimit fits a message that carries an attestation: JSON
// encodes its bytes in base64.
func (c *creds) attestationLimit() int {
	return base64.StdEncoding.EncodedLen(c.cfg.MaxAttestationSize) + envelopeLimit
}

func (c *creds) clientExchange(ctx context.Context, conn *tls.Conn, cert tls.Certificate) (credentials.AuthInfo, error) {
	state, exporter, err := tlsHandshake(ctx, conn)
	if err != nil {
		var plain tls.RecordHeaderError
		if errors.As(err, &plain) {
			return nil, &NotATLSError{What: "does not speak TLS", Saw: plain.RecordHeader[:]}
		}
		if refusedALPN(err) {
			return nil, &NotATLSError{What: "speaks TLS but not gRPC (it refused the h2 protocol)"}
		}
		return nil, err
	}
	hello := message{Attests: c.cfg.Issuer != nil}
	if len(c.cfg.Validators) > 0 {
		if hello.Nonce, err = randomNonce(); err != nil {
			return nil, err
		}
	}
	if err := writeMessage(conn, hello); err != nil {
		return nil, err
	}
	replyLimit := envelopeLimit
	if hello.Nonce != nil {
		replyLimit = c.attestationLimit()
	}
	reply, err := readMessage(conn, "reply", replyLimit)
	var tooLong *frameTooLongError
	if errors.As(err, &tooLong) && isText(tooLong.header[:]) {
		return nil, &NotATLSError{What: "speaks TLS but not attested TLS", Saw: tooLong.header[:]}
	}
	if err != nil {
		return nil, err
	}
	if reply.Error != "" {
		return nil, &ServerEndedError{Reason: reply.Error}
	}

	info := AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, TLS: state}
	if hello.Nonce != nil {
		v, proof, err := c.validate(ctx, reply, hello.Nonce, exporter, state)
		if err != nil {
			_ = writeMessage(conn, message{Error: truncate("client rejected the server's attestation: " + err.Error())})
			return nil, &RejectedError{Err: err}
		}
		info.PeerVariant, info.PeerInstance, info.PeerHardware = v, proof.Instance, proof.Hardware
	}

	var finish message
	if reply.Nonce != nil {
		if finish, err = c.attest(ctx, reply.Nonce, exporter, cert); err != nil {
			_ = writeMessage(conn, message{Error: truncate("client could not attest: " + err.Error())})
			return nil, err
		}
	}
	if err := writeMessage(conn, finish); err != nil {
		return nil, err
	}
	verdict, err := readMessage(conn, "verdict", envelopeLimit)
	if err != nil {
		return nil, err
	}
	if verdict.Error != "" {
		return nil, fmt.Errorf("atls: server refused this client: %s", verdict.Error)
	}
	return info, nil
}

func (c *creds) serverExchange(ctx context.Context, conn *tls.Conn, cert tls.Certificate) (credentials.AuthInfo, error) {
	state, exporter, err := tlsHandshake(ctx, conn)
	if err != nil {
		return nil, err
	}
	hello, err := readMessage(conn, "hello", helloLimit)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (credentials.AuthInfo, error) {
		_ = writeMessage(conn, message{Error: truncate(err.Error())})
		return nil, fmt.Errorf("atls: %w", err)
	}
	if c.cfg.AuthorizeClient != nil {
		// TLS 1.3 makes the client prove its key (CertificateVerify),
		// and RequireAnyClientCert makes it present one.
		if err := c.cfg.AuthorizeClient(state.PeerCertificates[0].PublicKey); err != nil {
			if c.cfg.OnPeerRejected != nil {
				c.cfg.OnPeerRejected(conn.RemoteAddr(), err)
			}
			return fail(fmt.Errorf("client not authorized: %w", err))
		}
	}
	// The client has spoken in time; the rest may take quotes.
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	if len(c.cfg.Validators) > 0 && !hello.Attests {
		return fail(errors.New("this server requires clients to attest, and the client cannot"))
	}
	var reply message
	if hello.Nonce != nil {
		if reply, err = c.attest(ctx, hello.Nonce, exporter, cert); err != nil {
			return fail(err)
		}
	}
	if len(c.cfg.Validators) > 0 {
		if reply.Nonce, err = randomNonce(); err != nil {
			return fail(err)
		}
	}
	if err := writeMessage(conn, reply); err != nil {
		return nil, err
	}
	finishLimit := envelopeLimit
	if reply.Nonce != nil {
		finishLimit = c.attestationLimit()
	}
	finish, err := readMessage(conn, "finish", finishLimit)
	if err != nil {
		return nil, err
	}
	if finish.Error != "" {
		return nil, fmt.Errorf("atls: client ended the handshake: %s", finish.Error)
	}
	info := AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, TLS: state}
	if reply.Nonce != nil {
		v, proof, err := c.validate(ctx, finish, reply.Nonce, exporter, state)
		if err != nil {
			if c.cfg.OnPeerRejected != nil {
				c.cfg.OnPeerRejected(conn.RemoteAddr(), err)
			}
			_ = writeMessage(conn, message{Error: truncate("attestation rejected: " + err.Error())})
			return nil, fmt.Errorf("atls: client's attestation rejected: %w", err)
		}
		info.PeerVariant, info.PeerInstance, info.PeerHardware = v, proof.Instance, proof.Hardware
	}
	if err := writeMessage(conn, message{}); err != nil {
		return nil, err
	}
	return info, nil
}

// tlsHandshake completes the TLS handshake and returns the connection's
// state and its exporter secret, which every attestation on it binds.
func tlsHandshake(ctx context.Context, conn *tls.Conn) (tls.ConnectionState, []byte, error) {
	if err := conn.HandshakeContext(ctx); err != nil {
		return tls.ConnectionState{}, nil, fmt.Errorf("atls: TLS handshake: %w", err)
	}
	state := conn.ConnectionState()
	exporter, err := state.ExportKeyingMaterial(exporterLabel, nil, 32)
	if err != nil {
		return state, nil, fmt.Errorf("atls: %w", err)
	}
	return state, exporter, nil
}

// attest answers a peer's nonce with an attestation bound to this
// connection and to this side's TLS key.
func (c *creds) attest(ctx context.Context, peerNonce, exporter []byte, cert tls.Certificate) (message, error) {
	if c.cfg.Issuer == nil {
		return message{}, errors.New("the peer requires an attestation, and this side has no attestation issuer")
	}
	if len(peerNonce) != nonceSize {
		return message{}, fmt.Errorf("peer sent a %d-byte nonce, want %d", len(peerNonce), nonceSize)
	}
	select {
	case c.quotes <- struct{}{}:
		defer func() { <-c.quotes }()
	case <-ctx.Done():
		return message{}, fmt.Errorf("wait for a turn to quote (the TPM is busy with other peers; retry later): %w", ctx.Err())
	}
	doc, err := c.cfg.Issuer.Issue(ctx, spki(cert.Leaf), sessionNonce(peerNonce, exporter))
	if err != nil {
		return message{}, fmt.Errorf("issue attestation: %w", err)
	}
	return message{Variant: c.cfg.Issuer.Variant().OID(), Attestation: doc}, nil
}

// validate checks the peer's attestation against our nonce and this
// connection, and that it names the key the peer holds in this TLS session.
// It returns the peer's variant and what its validator proved.
func (c *creds) validate(ctx context.Context, m message, nonce, exporter []byte, state tls.ConnectionState) (variant.Variant, attestation.Proof, error) {
	var none attestation.Proof
	if len(m.Attestation) == 0 {
		return variant.Variant{}, none, errors.New("peer sent no attestation")
	}
	if len(m.Attestation) > c.cfg.MaxAttestationSize {
		return variant.Variant{}, none, fmt.Errorf("peer sent a %d-byte attestation, more than the limit of %d; raise Config.MaxAttestationSize if a genuine node's is this large", len(m.Attestation), c.cfg.MaxAttestationSize)
	}
	v, err := variant.FromOID(m.Variant)
	if err != nil {
		return variant.Variant{}, none, err
	}
	var val attestation.Validator
	for _, cand := range c.cfg.Validators {
		if cand.Variant() == v {
			val = cand
		}
	}
	if val == nil {
		return variant.Variant{}, none, fmt.Errorf("peer attested as %s, which this side does not accept", v)
	}
	proof, err := attestation.ValidateProof(ctx, val, m.Attestation, sessionNonce(nonce, exporter))
	if err != nil {
		return variant.Variant{}, none, err
	}
	if len(state.PeerCertificates) == 0 {
		return variant.Variant{}, none, errors.New("peer presented no TLS certificate")
	}
	if string(proof.UserData) != string(state.PeerCertificates[0].RawSubjectPublicKeyInfo) {
		return variant.Variant{}, none, errors.New("attestation is bound to a different TLS key than the peer's (relayed from another connection?)")
	}
	return v, proof, nil
}

// sessionNonce mixes the verifier's nonce with the connection's exporter.
func sessionNonce(nonce, exporter []byte) []byte {
	h := sha256.New()
	h.Write([]byte(exporterLabel))
	h.Write(nonce)
	h.Write(exporter)
	return h.Sum(nil)
}

func spki(leaf *x509.Certificate) []byte { return leaf.RawSubjectPublicKeyInfo }

func randomNonce() ([]byte, error) {
	n := make([]byte, nonceSize)
	if _, err := rand.Read(n); err != nil {
		return nil, fmt.Errorf("atls: generate nonce: %w", err)
	}
	return n, nil
}

func truncate(s string) string {
	if len(s) > maxErrorLen {
		return s[:maxErrorLen] + "..."
	}
	return s
}

// selfSignedCert creates a self-signed certificate for one connection,
// for key or, if key is nil, for a fresh key, so that no two connections
// share a key to bind an attestation to.
func selfSignedCert(key crypto.Signer) (tls.Certificate, error) {
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("atls: generate TLS key: %w", err)
		}
		key = k
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "orrery atls"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("atls: create TLS certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func writeMessage(w io.Writer, m message) error {
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("atls: encode message: %w", err)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	if _, err := w.Write(frame); err != nil {
		return fmt.Errorf("atls: send: %w", err)
	}
	return nil
}

// readMessage reads exactly one frame and nothing more: the bytes after it
// belong to gRPC. A frame longer than limit is refused unread, and the
// body grows as its bytes arrive, so a peer that announces a large frame
// and then stalls costs no more memory than it sent.
func readMessage(r io.Reader, step string, limit int) (message, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return message{}, fmt.Errorf("atls: receive %s: %w", step, err)
	}
	n := int64(binary.BigEndian.Uint32(hdr[:]))
	if n > int64(limit) {
		return message{}, &frameTooLongError{header: hdr, size: n, step: step, limit: limit}
	}
	body, err := io.ReadAll(io.LimitReader(r, n))
	if err != nil {
		return message{}, fmt.Errorf("atls: receive %s: %w", step, err)
	}
	if int64(len(body)) < n {
		return message{}, fmt.Errorf("atls: receive %s: %w", step, io.ErrUnexpectedEOF)
	}
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return message{}, fmt.Errorf("atls: decode %s: %w", step, err)
	}
	return m, nil
}
