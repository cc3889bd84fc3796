package atls_test

import (
	"crypto/tls"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// BenchmarkHandshakeAndRPC measures what a join costs on the wire: a new
// connection (TLS 1.3 handshake, quote by swtpm, validation) plus one RPC.
func BenchmarkHandshakeAndRPC(b *testing.B) {
	e := newEnv(b)
	for _, side := range []string{"server attests", "client attests"} {
		b.Run(side, func(b *testing.B) {
			srv, cli := atls.Config{Issuer: e.issuer}, atls.Config{Validators: []attestation.Validator{e.validator(b, e.want)}}
			if side == "client attests" {
				srv, cli = cli, srv
			}
			addr, seen := serve(b, srv)
			b.ResetTimer()
			for b.Loop() {
				if err := call(b, addr, cli); err != nil {
					b.Fatal(err)
				}
				<-seen
			}
		})
	}
}

// BenchmarkStalledConnections opens 1,000 connections to an attesting
// server with the default limits and then stalls on them, and reports the
// server's goroutines and heap before, during (the peak, sampled every
// 20 ms, and at 3 s) and after. Client and server share the process; the
// client's connections hold no goroutines and little memory.
//
//	go test -run=^$ -bench=StalledConnections -benchtime=1x ./internal/atls/
func BenchmarkStalledConnections(b *testing.B) {
	e := newEnv(b)
	honest := atls.Config{Validators: []attestation.Validator{e.validator(b, e.want)}}
	attacks := map[string]func(addr string) net.Conn{
		"silent TCP": func(addr string) net.Conn {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			return c
		},
		// Old code allocated what the header announced; do not run
		// this one against it with 1,000 connections.
		"TLS and a hello announcing 8 MiB": func(addr string) net.Conn {
			raw, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			raw.SetDeadline(time.Now().Add(2 * time.Second))
			c := tls.Client(raw, &tls.Config{
				MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
				Certificates: []tls.Certificate{selfSigned(b)}, NextProtos: []string{"h2"},
			})
			if c.Handshake() == nil {
				c.Write([]byte{0, 0x7f, 0xff, 0xff})
			}
			return raw
		},
	}
	for name, attack := range attacks {
		b.Run(name, func(b *testing.B) {
			addr, seen := serve(b, atls.Config{Issuer: e.issuer})
			for b.Loop() {
				if err := call(b, addr, honest); err != nil {
					b.Fatal(err)
				}
				<-seen
				stalls(b, addr, attack)
			}
		})
	}
}

func stalls(b *testing.B, addr string, attack func(addr string) net.Conn) {
	g0, h0 := runtime.NumGoroutine(), heapInUse()
	var peakG, peakH atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peakG.Store(max(peakG.Load(), int64(runtime.NumGoroutine())))
			peakH.Store(max(peakH.Load(), int64(ms.HeapInuse)))
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	conns := make([]net.Conn, 1000)
	for i := range conns {
		conns[i] = attack(addr)
	}
	opened := time.Since(start)
	time.Sleep(3 * time.Second)
	g1, h1 := runtime.NumGoroutine(), heapInUse()
	close(stop)
	<-sampled
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(time.Second)
	g2, h2 := runtime.NumGoroutine(), heapInUse()
	b.Logf("1,000 connections opened in %v", opened.Round(time.Millisecond))
	b.Logf("goroutines: before %d, during peak %d, at 3 s %d, after %d", g0, peakG.Load(), g1, g2)
	b.Logf("heap in use: before %.1f MiB, during peak %.1f MiB, at 3 s %.1f MiB, after %.1f MiB", mib(h0), mib(peakH.Load()), mib(h1), mib(h2))
	b.ReportMetric(float64(peakG.Load()-int64(g0)), "peak-extra-goroutines")
	b.ReportMetric(mib(peakH.Load()-h0), "peak-extra-heap-MiB")
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
