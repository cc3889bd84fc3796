package dialer

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/owner/ownertest"
)

// node serves attested TLS from a provisioned swtpm once after has
// passed (a node still booting), and returns its address at once.
func node(t *testing.T, n *qemutest.Node, after time.Duration) string {
	t.Helper()
	return ownertest.Serve(t, n, nil, after)
}

func dialerFor(t *testing.T, n *qemutest.Node, pcr11 []byte) *Dialer {
	t.Helper()
	zero := make([]byte, 32)
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: measurements.M{4: {Expected: zero}, 11: {Expected: pcr11}},
		PlatformCAs:  []*x509.Certificate{n.CA.Cert},
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	d.retryEvery = 100 * time.Millisecond
	return d
}

func TestWaitAttestedWaitsForABootingNode(t *testing.T) {
	n := qemutest.NewNode(t)
	addr := node(t, n, time.Second)
	d := dialerFor(t, n, make([]byte, 32))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var retries int
	err := d.WaitAttested(ctx, addr, func(attempt int, err error) error {
		retries = attempt
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if retries == 0 {
		t.Fatal("the node was up at once; the test wants one that boots")
	}
}

func TestWaitAttestedStopsWhenTold(t *testing.T) {
	n := qemutest.NewNode(t)
	addr := node(t, n, time.Hour)
	d := dialerFor(t, n, make([]byte, 32))
	stop := errors.New("the node will never answer")
	err := d.WaitAttested(context.Background(), addr, func(int, error) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("err %v, want the callback's", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := d.WaitAttested(ctx, addr, nil); err == nil || !strings.Contains(err.Error(), "did not answer in time") {
		t.Fatalf("err %v, want a timeout that says so", err)
	}
}

// A node that answers with the wrong measurements is refused at once.
func TestWaitAttestedRefusesAnotherImage(t *testing.T) {
	n := qemutest.NewNode(t)
	addr := node(t, n, 0)
	d := dialerFor(t, n, bytes.Repeat([]byte{1}, 32))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var retried bool
	err := d.WaitAttested(ctx, addr, func(_ int, err error) error {
		// The listener may not be up for the very first attempt.
		if !strings.Contains(err.Error(), "connection refused") {
			retried = true
		}
		return nil
	})
	var refused *NotAttestedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "PCR 11 mismatch") {
		t.Fatalf("err %v; want a NotAttestedError naming PCR 11", err)
	}
	if retried {
		t.Fatal("a refused attestation was retried")
	}
}

// An address that keeps refusing connections ends the wait once the grace
// for a starting service is over, saying what to check.
func TestWaitAttestedGivesUpOnRefusal(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	d := dialerFor(t, qemutest.NewNode(t), make([]byte, 32))
	d.RefusedGrace = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err = d.WaitAttested(ctx, addr, nil)
	var nothing *NothingListensError
	if !errors.As(err, &nothing) {
		t.Fatalf("err %v, want a *NothingListensError", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %s; want about the 500 ms grace", took)
	}
	if !strings.Contains(err.Error(), "nothing listens on "+addr) || !strings.Contains(err.Error(), "orrery mini status") {
		t.Errorf("error %q does not say what to check", err)
	}
}

// A node whose attested handshake takes longer than gRPC's own connect
// deadline (20 s), as a node service that systemd starts on the owner's
// first connection did on a starved VM: the command's first call still
// succeeds, within the command's timeout.
func TestConnWaitsForASlowlyStartingService(t *testing.T) {
	n := qemutest.NewNode(t)
	addr := atlstest.Serve(t, atls.Config{Issuer: atlstest.SlowIssuer{Issuer: n.Issuer, Delay: 22 * time.Second}}, func(*grpc.Server) {})
	d := dialerFor(t, n, make([]byte, 32))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := d.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	// The server has no health service: Unimplemented is its answer,
	// given after the attestation passed.
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("after %v: %v, want the service's answer (Unimplemented)", time.Since(start).Round(time.Second), err)
	}
}
