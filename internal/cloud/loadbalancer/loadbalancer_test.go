package loadbalancer

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestRender(t *testing.T) {
	cfg, err := Render(Config{
		Dir: "/run/cloud/lb", Address: netip.MustParseAddr("10.42.0.2"), Ports: []uint16{6443, 30090},
		Backends: []Backend{{"cp-0", netip.MustParseAddr("10.42.1.100")}, {"cp-1", netip.MustParseAddr("10.42.1.101")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stats socket /run/cloud/lb/haproxy.sock mode 600 level admin",
		"bind 10.42.0.2:6443", "bind 10.42.0.2:30090",
		"default-server check inter 5000ms fall 3 rise 2 on-marked-down shutdown-sessions",
		"server cp-0 10.42.1.100:6443", "server cp-1 10.42.1.101:6443", "server cp-1 10.42.1.101:30090",
	} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("the configuration lacks %q:\n%s", want, cfg)
		}
	}
	ready, err := Render(Config{
		Dir: "/run/cloud/lb", Address: netip.MustParseAddr("10.42.0.2"), Ports: []uint16{6443, 30090},
		Backends:   []Backend{{"cp-0", netip.MustParseAddr("10.42.1.100")}},
		ReadyPaths: map[uint16]string{6443: "/readyz"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(ready), "option httpchk GET /readyz"); n != 1 || !strings.Contains(string(ready), "server cp-0.fallback 10.42.1.100:6443 backup no-check") {
		t.Errorf("the API server's port is checked %d times with /readyz, or has no fallback:\n%s", n, ready)
	}
	if _, err := Render(Config{Address: netip.MustParseAddr("10.42.0.2"), Ports: []uint16{6443}, Backends: []Backend{{"cp-0", netip.MustParseAddr("10.42.1.100")}},
		ReadyPaths: map[uint16]string{6443: "readyz now"}}); err == nil {
		t.Error("a readiness path with a space was accepted")
	}
	for _, bad := range []Config{
		{Address: netip.MustParseAddr("10.42.0.2"), Ports: []uint16{6443}},
		{Address: netip.MustParseAddr("10.42.0.2"), Ports: []uint16{6443}, Backends: []Backend{{"cp 0", netip.MustParseAddr("10.42.1.100")}}},
		{Ports: []uint16{6443}, Backends: []Backend{{"cp-0", netip.MustParseAddr("10.42.1.100")}}},
	} {
		if _, err := Render(bad); err == nil {
			t.Errorf("Render(%+v) passed", bad)
		}
	}
}

// freePort checks that HAProxy is installed and returns a port free on
// loopback, as a number and as text.
func freePort(t *testing.T) (int, string) {
	t.Helper()
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Fatal("haproxy is not installed: 'make deps' installs it")
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	return port, strconv.Itoa(port)
}

// backend answers each connection on addr with its name.
func backend(t *testing.T, addr, name string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, name)
			c.Close()
		}
	}()
	return l
}

// TestFailover runs the real HAProxy in front of two backends: both
// serve while both are up, and once one stops, its health check takes it
// out and every connection reaches the other.
func TestFailover(t *testing.T) {
	port, p := freePort(t)
	backend(t, "127.0.0.2:"+p, "cp-0")
	second := backend(t, "127.0.0.3:"+p, "cp-1")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Start(ctx, Config{
		Dir: t.TempDir(), Address: netip.MustParseAddr("127.0.0.1"), Ports: []uint16{uint16(port)},
		Backends:   []Backend{{"cp-0", netip.MustParseAddr("127.0.0.2")}, {"cp-1", netip.MustParseAddr("127.0.0.3")}},
		CheckEvery: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()

	waitFor(t, b, map[string]bool{"cp-0": true, "cp-1": true})
	if got := reached(t, "127.0.0.1:"+p, 6); !got["cp-0"] || !got["cp-1"] {
		t.Errorf("with both up, connections reached %v, want both", got)
	}
	second.Close()
	waitFor(t, b, map[string]bool{"cp-0": true, "cp-1": false})
	if got := reached(t, "127.0.0.1:"+p, 6); !got["cp-0"] || got["cp-1"] {
		t.Errorf("with cp-1 down, connections reached %v, want cp-0 alone", got)
	}

	b.Stop()
	if _, err := net.DialTimeout("tcp", "127.0.0.1:"+p, time.Second); err == nil {
		t.Error("the stopped balancer still accepts connections")
	}
}

// waitFor waits until the balancer sees each backend of want up or down.
func waitFor(t *testing.T, b *Balancer, want map[string]bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		servers, err := b.Servers(context.Background())
		got := map[string]bool{}
		for _, s := range servers {
			got[s.Name] = s.Up
		}
		match := err == nil && len(got) == len(want)
		for name, up := range want {
			match = match && got[name] == up
		}
		if match {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backends %+v (%v), want up: %v", servers, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reached makes n connections to addr and returns the backends that
// answered.
func reached(t *testing.T, addr string, n int) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connect through the balancer: %v", err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || len(b) == 0 {
			t.Fatalf("read through the balancer: %q, %v", b, err)
		}
		got[string(b)] = true
	}
	return got
}

// TestOutlivesTheThreadThatStartedIt starts the balancer from a goroutine
// locked to a thread that then ends, as the cloud's network-namespace
// helper ends every thread it used: HAProxy must go on serving. With a
// plain exec.Cmd.Start it got its parent-death SIGTERM, and the cloud's
// load balancer refused every connection for the rest of the run.
func TestOutlivesTheThreadThatStartedIt(t *testing.T) {
	port, p := freePort(t)
	backend(t, "127.0.0.2:"+p, "cp-0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b *Balancer
	var err error
	started := make(chan struct{})
	go func() {
		runtime.LockOSThread() // and never unlocked: the thread ends with the goroutine
		defer close(started)
		b, err = Start(ctx, Config{
			Dir: t.TempDir(), Address: netip.MustParseAddr("127.0.0.1"), Ports: []uint16{uint16(port)},
			Backends: []Backend{{"cp-0", netip.MustParseAddr("127.0.0.2")}}, CheckEvery: 100 * time.Millisecond,
		})
	}()
	<-started
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	select {
	case <-b.done:
		t.Fatalf("HAProxy exited with the thread that started it: %v", b.err)
	case <-time.After(time.Second): // the signal is asynchronous
	}
	waitFor(t, b, map[string]bool{"cp-0": true})
	if got := reached(t, "127.0.0.1:"+p, 2); !got["cp-0"] {
		t.Errorf("connections reached %v, want cp-0", got)
	}
}

// An address the machine does not have: HAProxy cannot bind it, exits,
// and Start says where its log tells why.
func TestStartOnAnAddressNotHere(t *testing.T) {
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Fatal("haproxy is not installed: 'make deps' installs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := Start(ctx, Config{
		Dir: t.TempDir(), Address: netip.MustParseAddr("192.0.2.1"), Ports: []uint16{6443},
		Backends: []Backend{{"cp-0", netip.MustParseAddr("127.0.0.2")}},
	})
	if err == nil || !strings.Contains(err.Error(), LogFile) || !strings.Contains(err.Error(), "192.0.2.1:6443") {
		t.Fatalf("Start = %v, want an error that names the log and quotes its complaint", err)
	}
}

// apiServer serves HTTPS on addr like an API server: its name at /, and
// /readyz with 200 while ready says so.
func apiServer(t *testing.T, addr, name string, ready *atomic.Bool) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && !ready.Load() {
			http.Error(w, "not ready", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, name)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.StartTLS()
	t.Cleanup(srv.Close)
}

// TestReadiness runs the real HAProxy in front of two HTTPS backends with
// a readiness path: one that listens but is not ready gets no connection
// while another is ready, and with none ready both get them.
func TestReadiness(t *testing.T) {
	port, p := freePort(t)
	var ready0, ready1 atomic.Bool
	ready0.Store(true)
	apiServer(t, "127.0.0.2:"+p, "cp-0", &ready0)
	apiServer(t, "127.0.0.3:"+p, "cp-1", &ready1)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Start(ctx, Config{
		Dir: t.TempDir(), Address: netip.MustParseAddr("127.0.0.1"), Ports: []uint16{uint16(port)},
		Backends:   []Backend{{"cp-0", netip.MustParseAddr("127.0.0.2")}, {"cp-1", netip.MustParseAddr("127.0.0.3")}},
		ReadyPaths: map[uint16]string{uint16(port): "/readyz"}, CheckEvery: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()

	addr := "127.0.0.1:" + p
	waitFor(t, b, map[string]bool{"cp-0": true, "cp-1": false})
	if got := reachedHTTPS(t, addr, 6); !got["cp-0"] || got["cp-1"] {
		t.Errorf("with cp-1 listening but not ready, requests reached %v, want cp-0 alone", got)
	}
	ready0.Store(false)
	waitFor(t, b, map[string]bool{"cp-0": false, "cp-1": false})
	if got := reachedHTTPS(t, addr, 6); !got["cp-0"] || !got["cp-1"] {
		t.Errorf("with none ready, requests reached %v, want both", got)
	}
	ready1.Store(true)
	waitFor(t, b, map[string]bool{"cp-0": false, "cp-1": true})
	if got := reachedHTTPS(t, addr, 6); got["cp-0"] || !got["cp-1"] {
		t.Errorf("with cp-1 alone ready, requests reached %v, want cp-1 alone", got)
	}
}

// reachedHTTPS makes n requests, each on a new connection, to addr and
// returns the backends that answered.
func reachedHTTPS(t *testing.T, addr string, n int) map[string]bool {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // test backends with throwaway certificates
		DisableKeepAlives: true,
	}}
	got := map[string]bool{}
	for range n {
		resp, err := client.Get("https://" + addr + "/")
		if err != nil {
			t.Fatalf("request through the balancer: %v", err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || len(b) == 0 {
			t.Fatalf("read through the balancer: %q, %v", b, err)
		}
		got[string(b)] = true
	}
	return got
}
