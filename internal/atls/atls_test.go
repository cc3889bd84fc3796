package atls_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// env is one attesting node (a provisioned swtpm) and the expected
// measurements a verifier holds for it.
type env struct {
	issuer   attestation.Issuer
	ca       *platformca.CA
	instance attestation.Instance
	want     measurements.M
}

func newEnv(t testing.TB) *env {
	t.Helper()
	n := qemutest.NewNode(t)
	n.Measure(t, 11, "enter-initrd", "initrd: enter-initrd")
	zero := make([]byte, 32)
	d := sha256.Sum256([]byte("enter-initrd"))
	pcr11 := sha256.Sum256(append(zero, d[:]...))
	want := measurements.M{4: {Expected: zero}, 9: {Expected: zero}, 11: {Expected: pcr11[:]}, 15: {Expected: zero}}
	return &env{issuer: n.Issuer, ca: n.CA, instance: n.Instance, want: want}
}

func (e *env) validator(t testing.TB, m measurements.M) attestation.Validator {
	t.Helper()
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: []*x509.Certificate{e.ca.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// serve starts a gRPC health server with the given credentials and returns
// its address and a channel of the AuthInfo each RPC saw.
func serve(t testing.TB, cfg atls.Config) (string, chan atls.AuthInfo) {
	t.Helper()
	creds, err := atls.NewCredentials(cfg)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan atls.AuthInfo, 100)
	srv := grpc.NewServer(grpc.Creds(creds), grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if p, ok := peer.FromContext(ctx); ok {
			if ai, ok := p.AuthInfo.(atls.AuthInfo); ok {
				seen <- ai
			}
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), seen
}

func call(t testing.TB, addr string, cfg atls.Config) error {
	t.Helper()
	creds, err := atls.NewCredentials(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestServerAttests(t *testing.T) {
	e := newEnv(t)
	addr, seen := serve(t, atls.Config{Issuer: e.issuer})
	if err := call(t, addr, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}}); err != nil {
		t.Fatalf("RPC to attested server failed: %v", err)
	}
	if ai := <-seen; ai.PeerVariant != (variant.Variant{}) || !ai.PeerInstance.IsZero() {
		t.Fatalf("server saw a client variant %v, instance %v, but the client did not attest", ai.PeerVariant, ai.PeerInstance)
	}
}

func TestClientAttests(t *testing.T) {
	e := newEnv(t)
	addr, seen := serve(t, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}})
	if err := call(t, addr, atls.Config{Issuer: e.issuer}); err != nil {
		t.Fatalf("RPC from attested client failed: %v", err)
	}
	if ai := <-seen; ai.PeerVariant != variant.QEMUVTPM || ai.PeerInstance != e.instance {
		t.Fatalf("server saw client variant %v, instance %v; want %v, %v", ai.PeerVariant, ai.PeerInstance, variant.QEMUVTPM, e.instance)
	}
}

// onlyValidator hides every method of a validator but attestation.Validator's.
type onlyValidator struct{ attestation.Validator }

// A validator that cannot tell instances names none: the handler must not
// take the zero Instance for anyone.
func TestValidatorWithoutInstances(t *testing.T) {
	e := newEnv(t)
	addr, seen := serve(t, atls.Config{Validators: []attestation.Validator{onlyValidator{e.validator(t, e.want)}}})
	if err := call(t, addr, atls.Config{Issuer: e.issuer}); err != nil {
		t.Fatalf("RPC from attested client failed: %v", err)
	}
	if ai := <-seen; ai.PeerVariant != variant.QEMUVTPM || !ai.PeerInstance.IsZero() {
		t.Fatalf("server saw client variant %v, instance %v; want %v and no instance", ai.PeerVariant, ai.PeerInstance, variant.QEMUVTPM)
	}
}

func wrongPCR(m measurements.M) measurements.M {
	m = m.Copy()
	m[4] = measurements.Measurement{Expected: bytes.Repeat([]byte{1}, 32)}
	return m
}

func TestWrongMeasurementsRefused(t *testing.T) {
	e := newEnv(t)
	t.Run("server attests", func(t *testing.T) {
		addr, _ := serve(t, atls.Config{Issuer: e.issuer})
		err := call(t, addr, atls.Config{Validators: []attestation.Validator{e.validator(t, wrongPCR(e.want))}})
		if err == nil || !strings.Contains(err.Error(), "PCR 4 mismatch") {
			t.Fatalf("err = %v, want a PCR 4 mismatch", err)
		}
	})
	t.Run("client attests", func(t *testing.T) {
		rejected := make(chan error, 10)
		addr, seen := serve(t, atls.Config{
			Validators:     []attestation.Validator{e.validator(t, wrongPCR(e.want))},
			OnPeerRejected: func(_ net.Addr, err error) { rejected <- err },
		})
		err := call(t, addr, atls.Config{Issuer: e.issuer})
		if err == nil || !strings.Contains(err.Error(), "PCR 4 mismatch") {
			t.Fatalf("err = %v, want the server's PCR 4 mismatch passed to the client", err)
		}
		if len(seen) != 0 {
			t.Fatal("a refused client reached the RPC handler")
		}
		// The server's operator hears of it too, with the PCR that differs.
		select {
		case err := <-rejected:
			if !strings.Contains(err.Error(), "PCR 4 mismatch") {
				t.Fatalf("OnPeerRejected got %v, want the PCR 4 mismatch", err)
			}
		default:
			t.Fatal("OnPeerRejected was not called for a refused client")
		}
	})
}

// tamperingIssuer wraps a real issuer to play an attacker.
type tamperingIssuer struct {
	attestation.Issuer
	mu      sync.Mutex
	replay  []byte // first document, returned again for every later call
	doReply bool
	// userData, if set, replaces the TLS key the document binds.
	userData []byte
	// nonce, if set, replaces the verifier's nonce (a relayed challenge).
	nonce   []byte
	variant *variant.Variant
}

func (ti *tamperingIssuer) Variant() variant.Variant {
	if ti.variant != nil {
		return *ti.variant
	}
	return ti.Issuer.Variant()
}

func (ti *tamperingIssuer) Issue(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	if ti.replay != nil {
		return ti.replay, nil
	}
	if ti.userData != nil {
		userData = ti.userData
	}
	if ti.nonce != nil {
		nonce = ti.nonce
	}
	doc, err := ti.Issuer.Issue(ctx, userData, nonce)
	if ti.doReply {
		ti.replay = doc
	}
	return doc, err
}

func TestAttacksRefused(t *testing.T) {
	e := newEnv(t)
	unknown := variant.Variant{}
	tests := map[string]struct {
		issuer  *tamperingIssuer
		calls   int // the last call must fail, the ones before succeed
		wantErr string
	}{
		"replayed attestation from an earlier connection": {
			issuer: &tamperingIssuer{Issuer: e.issuer, doReply: true}, calls: 2, wantErr: "replayed",
		},
		"attestation bound to another TLS key": {
			issuer: &tamperingIssuer{Issuer: e.issuer, userData: []byte("another machine's TLS key")}, calls: 1, wantErr: "different TLS key",
		},
		"attestation for a relayed challenge": {
			issuer: &tamperingIssuer{Issuer: e.issuer, nonce: bytes.Repeat([]byte{7}, 32)}, calls: 1, wantErr: "replayed, relayed or tampered",
		},
		"unknown variant": {
			issuer: &tamperingIssuer{Issuer: e.issuer, variant: &unknown}, calls: 1, wantErr: "unknown attestation variant",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			addr, seen := serve(t, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}})
			for i := 1; i <= tc.calls; i++ {
				err := call(t, addr, atls.Config{Issuer: tc.issuer})
				if i < tc.calls {
					if err != nil {
						t.Fatalf("call %d: %v", i, err)
					}
					<-seen
					continue
				}
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
			}
			if len(seen) != 0 {
				t.Fatal("a refused client reached the RPC handler")
			}
		})
	}
}

func TestRoleMismatchIsExplained(t *testing.T) {
	e := newEnv(t)
	t.Run("server requires attestation, client has no issuer", func(t *testing.T) {
		addr, _ := serve(t, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}})
		err := call(t, addr, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}})
		if err == nil || !strings.Contains(err.Error(), "requires clients to attest") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("client requires attestation, server has no issuer", func(t *testing.T) {
		addr, _ := serve(t, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}})
		err := call(t, addr, atls.Config{Issuer: e.issuer, Validators: []attestation.Validator{e.validator(t, e.want)}})
		if err == nil || !strings.Contains(err.Error(), "no attestation issuer") {
			t.Fatalf("err = %v", err)
		}
		// Below gRPC, the client can tell this from a network failure.
		creds, err := atls.NewCredentials(atls.Config{Issuer: e.issuer, Validators: []attestation.Validator{e.validator(t, e.want)}})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		_, _, err = creds.ClientHandshake(context.Background(), addr, raw)
		var ended *atls.ServerEndedError
		if !errors.As(err, &ended) || !strings.Contains(ended.Reason, "no attestation issuer") {
			t.Fatalf("handshake err = %v, want a *atls.ServerEndedError with the server's reason", err)
		}
	})
	if _, err := atls.NewCredentials(atls.Config{}); err == nil {
		t.Fatal("credentials with neither issuer nor validators were created")
	}
}

// TestGarbageFromPeerDoesNotHurtServer sends junk instead of the exchange
// and checks the server stays up and serves the next honest client.
func TestGarbageFromPeerDoesNotHurtServer(t *testing.T) {
	e := newEnv(t)
	addr, _ := serve(t, atls.Config{Issuer: e.issuer})
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), bytes.Repeat([]byte{0xff}, 4096), {}} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}
	if err := call(t, addr, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}}); err != nil {
		t.Fatalf("honest client after garbage: %v", err)
	}
}
