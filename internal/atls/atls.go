// Package atls provides gRPC transport credentials for attested TLS: a TLS
// 1.3 connection after which one side (or both) proves with a remote
// attestation what it runs, bound to this very connection.
//
// Either side may attest. The owner's CLI verifies a node it sends secrets
// to (the server attests: init, recover); the join service verifies a node
// before it hands out keys (the client attests: join, rejoin).
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
package atls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// DefaultHandshakeTimeout bounds the TLS handshake and the attestation
// exchange when the caller sets no deadline. Quoting on a vTPM of an
// emulated (TCG) VM takes seconds, not milliseconds.
const DefaultHandshakeTimeout = 60 * time.Second

// Config says what this side of a connection proves and requires.
type Config struct {
	// Issuer, if set, makes this side attest itself when the peer asks.
	Issuer attestation.Issuer
	// Validators, if set, make this side require the peer to attest with
	// one of these variants. Empty means the peer need not attest.
	Validators []attestation.Validator
	// HandshakeTimeout applies when the context has no deadline (and on
	// the server side, always). Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// OnPeerRejected, if set, hears of every client whose attestation
	// this server refused. gRPC drops failed handshakes silently, and an
	// operator needs to see which node was turned away and why (the
	// error names the PCRs that differ).
	OnPeerRejected func(peer net.Addr, err error)
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
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return &creds{cfg: cfg}, nil
}

// RejectedError is returned by the client handshake when the server's
// attestation does not pass: unlike a network error, retrying will not
// help until the server runs something else.
type RejectedError struct{ Err error }

func (e *RejectedError) Error() string {
	return "atls: server's attestation rejected: " + e.Err.Error()
}

func (e *RejectedError) Unwrap() error { return e.Err }

// AuthInfo is what a gRPC handler learns about its peer (peer.FromContext).
type AuthInfo struct {
	credentials.CommonAuthInfo
	TLS tls.ConnectionState
	// PeerVariant is the variant the peer attested with; the zero value
	// if this side did not require an attestation.
	PeerVariant variant.Variant
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return "atls" }

type creds struct {
	cfg Config
}

func (c *creds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "atls"}
}

func (c *creds) Clone() credentials.TransportCredentials { cp := *c; return &cp }

// OverrideServerName is deprecated in gRPC and meaningless here: the peer
// is identified by its attestation, not by a name.
func (c *creds) OverrideServerName(string) error { return nil }

func (c *creds) ClientHandshake(ctx context.Context, _ string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cert, err := ephemeralCert()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	if d, ok := ctx.Deadline(); ok {
		raw.SetDeadline(d)
		defer raw.SetDeadline(time.Time{})
	}
	conn := tls.Client(raw, &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
		// The peer's certificate is ephemeral and self-signed; the
		// attestation below is what authenticates its key.
		InsecureSkipVerify: true,
	})
	info, err := c.clientExchange(ctx, conn, cert)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, info, nil
}

func (c *creds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cert, err := ephemeralCert()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HandshakeTimeout)
	defer cancel()
	d, _ := ctx.Deadline()
	raw.SetDeadline(d)
	defer raw.SetDeadline(time.Time{})
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

func (c *creds) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.HandshakeTimeout)
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
	nonceSize      = 32
	maxMessageSize = 8 << 20
	maxErrorLen    = 2048
	exporterLabel  = "EXPORTER-orrery-atls-v1"
)

func (c *creds) clientExchange(ctx context.Context, conn *tls.Conn, cert tls.Certificate) (credentials.AuthInfo, error) {
	state, exporter, err := tlsHandshake(ctx, conn)
	if err != nil {
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
	reply, err := readMessage(conn)
	if err != nil {
		return nil, err
	}
	if reply.Error != "" {
		return nil, fmt.Errorf("atls: server ended the handshake: %s", reply.Error)
	}

	info := AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, TLS: state}
	if hello.Nonce != nil {
		v, err := c.validate(ctx, reply, hello.Nonce, exporter, state)
		if err != nil {
			_ = writeMessage(conn, message{Error: truncate("client rejected the server's attestation: " + err.Error())})
			return nil, &RejectedError{Err: err}
		}
		info.PeerVariant = v
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
	verdict, err := readMessage(conn)
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
	hello, err := readMessage(conn)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (credentials.AuthInfo, error) {
		_ = writeMessage(conn, message{Error: truncate(err.Error())})
		return nil, fmt.Errorf("atls: %w", err)
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
	finish, err := readMessage(conn)
	if err != nil {
		return nil, err
	}
	if finish.Error != "" {
		return nil, fmt.Errorf("atls: client ended the handshake: %s", finish.Error)
	}
	info := AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, TLS: state}
	if reply.Nonce != nil {
		v, err := c.validate(ctx, finish, reply.Nonce, exporter, state)
		if err != nil {
			if c.cfg.OnPeerRejected != nil {
				c.cfg.OnPeerRejected(conn.RemoteAddr(), err)
			}
			_ = writeMessage(conn, message{Error: truncate("attestation rejected: " + err.Error())})
			return nil, fmt.Errorf("atls: client's attestation rejected: %w", err)
		}
		info.PeerVariant = v
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
	doc, err := c.cfg.Issuer.Issue(ctx, spki(cert.Leaf), sessionNonce(peerNonce, exporter))
	if err != nil {
		return message{}, fmt.Errorf("issue attestation: %w", err)
	}
	return message{Variant: c.cfg.Issuer.Variant().OID(), Attestation: doc}, nil
}

// validate checks the peer's attestation against our nonce and this
// connection, and that it names the key the peer holds in this TLS session.
func (c *creds) validate(ctx context.Context, m message, nonce, exporter []byte, state tls.ConnectionState) (variant.Variant, error) {
	if len(m.Attestation) == 0 {
		return variant.Variant{}, errors.New("peer sent no attestation")
	}
	v, err := variant.FromOID(m.Variant)
	if err != nil {
		return variant.Variant{}, err
	}
	var val attestation.Validator
	for _, cand := range c.cfg.Validators {
		if cand.Variant() == v {
			val = cand
		}
	}
	if val == nil {
		return variant.Variant{}, fmt.Errorf("peer attested as %s, which this side does not accept", v)
	}
	userData, err := val.Validate(ctx, m.Attestation, sessionNonce(nonce, exporter))
	if err != nil {
		return variant.Variant{}, err
	}
	if len(state.PeerCertificates) == 0 {
		return variant.Variant{}, errors.New("peer presented no TLS certificate")
	}
	if string(userData) != string(state.PeerCertificates[0].RawSubjectPublicKeyInfo) {
		return variant.Variant{}, errors.New("attestation is bound to a different TLS key than the peer's (relayed from another connection?)")
	}
	return v, nil
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

// ephemeralCert creates a fresh key and self-signed certificate for one
// connection, so that no two connections share a key to bind to.
func ephemeralCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("atls: generate TLS key: %w", err)
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
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
// belong to gRPC.
func readMessage(r io.Reader) (message, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return message{}, fmt.Errorf("atls: receive: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxMessageSize {
		return message{}, fmt.Errorf("atls: peer sent a %d-byte message, more than the limit of %d", n, maxMessageSize)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return message{}, fmt.Errorf("atls: receive: %w", err)
	}
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return message{}, fmt.Errorf("atls: decode message: %w", err)
	}
	return m, nil
}
