package atls_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// The tests here play peers that have proved nothing and try to make the
// other side spend memory, goroutines or TPM time on them.

// TestOversizedMessageRefusedUnallocated announces large frames and then
// sends nothing more: the server must refuse a frame larger than its step
// allows at once, and must not allocate a frame it allows before the bytes
// arrive.
func TestOversizedMessageRefusedUnallocated(t *testing.T) {
	e := newEnv(t)
	tests := map[string]struct {
		cfg       atls.Config
		preamble  func(t *testing.T, c net.Conn) // the exchange before the frame
		announced uint32
		refused   bool // closed at once; else held open and unallocated
	}{
		"hello of 8 MiB": {
			cfg: atls.Config{Issuer: e.issuer}, announced: 8<<20 - 1, refused: true,
		},
		"hello of 2 KiB": {
			cfg: atls.Config{Issuer: e.issuer}, announced: 2 << 10, refused: true,
		},
		"hello of 4 GiB": {
			cfg: atls.Config{Issuer: e.issuer}, announced: 1<<32 - 1, refused: true,
		},
		"finish of 8 MiB to a server that needs no attestation": {
			cfg: atls.Config{Issuer: e.issuer}, preamble: sendHello(false), announced: 8<<20 - 1, refused: true,
		},
		"finish of 8 MiB to a validating server": {
			cfg:      atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}},
			preamble: sendHello(true), announced: 8<<20 - 1, refused: true,
		},
		"finish of 1 MiB to a validating server, then a stall": {
			cfg:      atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}},
			preamble: sendHello(true), announced: 1 << 20, refused: false,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			addr, _ := serve(t, tc.cfg)
			const peers = 16
			before := heapInUse()
			conns := make([]*tls.Conn, peers)
			for i := range conns {
				c := attackerTLS(t, addr)
				if tc.preamble != nil {
					tc.preamble(t, c)
				}
				var hdr [4]byte
				binary.BigEndian.PutUint32(hdr[:], tc.announced)
				if _, err := c.Write(hdr[:]); err != nil {
					t.Fatal(err)
				}
				conns[i] = c
			}
			if tc.refused {
				for _, c := range conns {
					if !closedByPeer(c, 3*time.Second) {
						t.Fatalf("server still holds a connection that announced a %d-byte frame", tc.announced)
					}
				}
			}
			time.Sleep(200 * time.Millisecond)
			if grown := heapInUse() - before; grown > 8<<20 {
				t.Fatalf("heap grew by %d MiB for %d peers that announced %d bytes and sent none", grown>>20, peers, tc.announced)
			}
		})
	}
}

// TestSilentClientDropped connects and then says nothing at one step or
// another: the server must drop the connection after its HelloTimeout.
func TestSilentClientDropped(t *testing.T) {
	e := newEnv(t)
	addr, _ := serve(t, atls.Config{Issuer: e.issuer, HelloTimeout: 300 * time.Millisecond})
	tests := map[string]func(t *testing.T) net.Conn{
		"TCP only": func(t *testing.T) net.Conn { return dialTCP(t, addr) },
		"TLS done, no hello": func(t *testing.T) net.Conn {
			return attackerTLS(t, addr)
		},
		"half a hello": func(t *testing.T) net.Conn {
			c := attackerTLS(t, addr)
			c.Write([]byte{0, 0, 0, 40, '{'})
			return c
		},
	}
	for name, dial := range tests {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			if !closedByPeer(dial(t), 5*time.Second) {
				t.Fatal("server still holds a silent client after 5 s; want it dropped after its 300 ms HelloTimeout")
			}
			if d := time.Since(start); d < 250*time.Millisecond {
				t.Fatalf("dropped after %v, before the HelloTimeout", d)
			}
		})
	}
}

// TestStalledHandshakesCapped opens many more stalled connections than the
// server's MaxHandshakes: the server must hold on to no more than that
// many, and an honest client must get through once the stalls time out.
func TestStalledHandshakesCapped(t *testing.T) {
	e := newEnv(t)
	addr, seen := serve(t, atls.Config{
		Issuer: e.issuer, MaxHandshakes: 4,
		HandshakeQueueTimeout: 200 * time.Millisecond, HelloTimeout: 3 * time.Second,
	})
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	const stalls = 40
	conns := make([]net.Conn, stalls)
	for i := range conns {
		conns[i] = dialTCP(t, addr)
	}
	time.Sleep(700 * time.Millisecond) // past the queue timeout
	// Each handshake in progress holds gRPC's goroutine for the connection
	// and TLS's watcher of the handshake context.
	if grown := runtime.NumGoroutine() - before; grown > 4*2+6 {
		t.Fatalf("%d stalled connections hold %d goroutines on the server; want at most about 2 for each of the 4 handshake slots", stalls, grown)
	}
	var refused atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			if closedByPeer(c, 100*time.Millisecond) {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if refused.Load() < stalls-4 {
		t.Fatalf("the server closed %d of %d stalled connections beyond its 4 slots", refused.Load(), stalls-4)
	}

	start := time.Now()
	if err := callWaitForReady(t, addr, atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}}); err != nil {
		t.Fatalf("honest client after the stalls: %v", err)
	}
	<-seen
	t.Logf("honest client served %v after the stalls were refused or timed out", time.Since(start).Round(time.Millisecond))
}

// TestClientHandshakeTimeout dials servers that never answer: the client
// must give up after its HandshakeTimeout even when the context (as gRPC's
// always does) allows longer.
func TestClientHandshakeTimeout(t *testing.T) {
	e := newEnv(t)
	tests := map[string]func(c net.Conn){
		"silent TCP": func(c net.Conn) { io.Copy(io.Discard, c) },
		"TLS done, no reply": func(c net.Conn) {
			tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, ClientAuth: tls.RequireAnyClientCert})
			io.Copy(io.Discard, tc)
		},
	}
	for name, handle := range tests {
		t.Run(name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lis.Close() })
			go func() {
				for {
					c, err := lis.Accept()
					if err != nil {
						return
					}
					go func() { handle(c); c.Close() }()
				}
			}()
			creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}, HandshakeTimeout: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			raw := dialTCP(t, lis.Addr().String())
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, _, err := creds.ClientHandshake(ctx, "", raw)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("handshake with a silent server succeeded")
				}
			case <-time.After(5 * time.Second):
				raw.Close()
				<-done
				t.Fatal("client still in its handshake after 5 s; want it to give up after its 300 ms HandshakeTimeout")
			}
		})
	}
}

// TestQuotesLimited sends many hellos at once: the server must quote for
// at most MaxConcurrentQuotes of them at a time, and serve them all.
func TestQuotesLimited(t *testing.T) {
	e := newEnv(t)
	ci := &countingIssuer{Issuer: e.issuer}
	addr, seen := serve(t, atls.Config{Issuer: ci, MaxConcurrentQuotes: 1})
	const clients = 6
	errs := make(chan error, clients)
	honest := atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}}
	for range clients {
		go func() { errs <- call(t, addr, honest) }()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		<-seen
	}
	if ci.max != 1 {
		t.Fatalf("%d quotes ran at once, want at most 1", ci.max)
	}
}

// countingIssuer records how many Issue calls run at once, and in all.
type countingIssuer struct {
	attestation.Issuer
	mu              sync.Mutex
	now, max, total int
}

func (ci *countingIssuer) issued() int {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return ci.total
}

func (ci *countingIssuer) Issue(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	ci.mu.Lock()
	ci.now++
	ci.total++
	ci.max = max(ci.max, ci.now)
	ci.mu.Unlock()
	// Long enough that overlapping handshakes would overlap here.
	time.Sleep(50 * time.Millisecond)
	defer func() { ci.mu.Lock(); ci.now--; ci.mu.Unlock() }()
	return ci.Issuer.Issue(ctx, userData, nonce)
}

func TestNegativeLimitRefused(t *testing.T) {
	if _, err := atls.NewCredentials(atls.Config{Issuer: stubIssuer{}, MaxHandshakes: -1}); err == nil {
		t.Fatal("credentials with a negative MaxHandshakes were created")
	}
}

type stubIssuer struct{ attestation.Issuer }

// sendHello writes a hello as a client that does (or does not) attest and
// asks for no attestation, and reads the server's reply.
func sendHello(attests bool) func(t *testing.T, c net.Conn) {
	return func(t *testing.T, c net.Conn) {
		body := `{}`
		if attests {
			body = `{"attests":true}`
		}
		writeFrame(t, c, []byte(body))
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatalf("read reply: %v", err)
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[:]))); err != nil {
			t.Fatalf("read reply: %v", err)
		}
	}
}

func writeFrame(t *testing.T, w io.Writer, body []byte) {
	t.Helper()
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	if _, err := w.Write(append(frame, body...)); err != nil {
		t.Fatal(err)
	}
}

func callWaitForReady(t testing.TB, addr string, cfg atls.Config) error {
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	return err
}

func dialTCP(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// attackerTLS completes TLS with an atls server as any client can, with
// a throwaway certificate, and proves nothing.
func attackerTLS(t testing.TB, addr string) *tls.Conn {
	t.Helper()
	c := tls.Client(dialTCP(t, addr), &tls.Config{
		MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
		Certificates: []tls.Certificate{selfSigned(t)}, NextProtos: []string{"h2"},
	})
	if err := c.Handshake(); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	return c
}

func selfSigned(t testing.TB) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// closedByPeer reports whether the peer closes c (or resets it) within d,
// rather than leaving it open and silent.
func closedByPeer(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}
