//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// traffic asks a URL in the cloud's network namespace for a page, again
// and again, and counts the answers that failed: what a Service's users
// saw while the cluster changed under it.
type traffic struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	total    int
	failures []string // when and why, the first few
	failed   int
}

// startTraffic asks addr (HOST:PORT) for / every interval, each with
// timeout, until stop. Every connection is made from a thread inside the
// namespace: a socket belongs to the namespace of the thread that made
// it.
func startTraffic(addr string, interval, timeout time.Duration) (*traffic, error) {
	return startAsking(func() error { return ask(addr, timeout) }, interval)
}

// startAsking calls ask every interval, on a thread inside the cloud's
// network namespace, until stop, and counts the errors.
func startAsking(ask func() error, interval time.Duration) (*traffic, error) {
	ns, err := os.Open(filepath.Join("/run/netns", namespace))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{cancel: cancel, done: make(chan struct{})}
	entered := make(chan error, 1)
	go func() {
		defer close(tr.done)
		defer ns.Close()
		// The thread stays in the namespace; it is not unlocked, so the
		// runtime ends it with this goroutine instead of reusing it.
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			entered <- err
			return
		}
		entered <- nil
		for ctx.Err() == nil {
			tr.record(ask())
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
	}()
	if err := <-entered; err != nil {
		cancel()
		return nil, fmt.Errorf("enter the cloud's network namespace: %w", err)
	}
	return tr, nil
}

// askAPI reads the default Namespace from the API server at host (a
// kubeconfig's https://HOST:PORT) with tlsCfg, over a connection made on
// this thread: a quorum read, which only an API server whose etcd serves
// answers.
func askAPI(host string, tlsCfg *tls.Config, timeout time.Duration) error {
	addr := strings.TrimPrefix(host, "https://")
	// client-go leaves the name to check to its HTTP transport.
	cfg := tlsCfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	return get(addr, "/api/v1/namespaces/default", timeout, func(c net.Conn) net.Conn { return tls.Client(c, cfg) })
}

// ask gets / from addr over a connection made on this thread.
func ask(addr string, timeout time.Duration) error {
	return get(addr, "/", timeout, func(c net.Conn) net.Conn { return c })
}

// get asks addr for path over a connection made on this thread, wrapped
// by wrap (TLS), and wants a 200.
func get(addr, path string, timeout time.Duration, wrap func(net.Conn) net.Conn) error {
	raw, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	conn := wrap(raw)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, addr); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

func (tr *traffic) record(err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.total++
	if err == nil {
		return
	}
	tr.failed++
	if len(tr.failures) < 10 {
		tr.failures = append(tr.failures, time.Now().UTC().Format("15:04:05.0")+" "+err.Error())
	}
}

// stop stops asking, and returns how many requests were made, how many
// failed, and the first failures.
func (tr *traffic) stop() (total, failed int, first []string) {
	tr.cancel()
	<-tr.done
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.total, tr.failed, tr.failures
}
