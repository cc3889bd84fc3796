package atls_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// The recorder says why the last handshake failed when the peer proved
// nothing or refused this client, and nothing when the peer was merely
// unreachable or the handshake succeeded.
func TestRecorderTellsARefusalFromAnOutage(t *testing.T) {
	e := newEnv(t)
	check := func(addr string, cfg atls.Config) (*atls.Recorder, error) {
		t.Helper()
		creds, err := atls.NewCredentials(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := atls.NewRecorder(creds)
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(r))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return r, err
	}
	good := atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}}
	addr, _ := serve(t, atls.Config{Issuer: e.issuer})

	r, err := check(addr, good)
	if err != nil || r.Refusal() != nil {
		t.Fatalf("a good server: call %v, refusal %v", err, r.Refusal())
	}
	r, err = check(addr, atls.Config{Validators: []attestation.Validator{e.validator(t, wrongPCR(e.want))}})
	var rejected *atls.RejectedError
	if err == nil || !errors.As(r.Refusal(), &rejected) {
		t.Fatalf("a server of another image: call %v, refusal %v; want a *RejectedError", err, r.Refusal())
	}
	strict, _ := serve(t, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}})
	r, err = check(strict, good)
	var ended *atls.ServerEndedError
	if err == nil || !errors.As(r.Refusal(), &ended) {
		t.Fatalf("a server that wants the client to attest: call %v, refusal %v; want a *ServerEndedError", err, r.Refusal())
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	r, err = check(closed, good)
	if err == nil || r.Refusal() != nil {
		t.Fatalf("nothing listening: call %v, refusal %v; want no refusal", err, r.Refusal())
	}
}
