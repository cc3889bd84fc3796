// Package loadbalancer is the local cloud's TCP load balancer in front of
// its control planes, as a real cloud's passthrough network load balancer
// is: HAProxy from Debian, forwarding each port to the same port of every
// control plane that passes its health check. It only forwards bytes: TLS
// and attested TLS run end to end between the client and the node, so the
// balancer can delay, drop or misroute a connection but not read or
// change it.
package loadbalancer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// Files in Config.Dir.
const (
	ConfigFile = "haproxy.cfg"
	SocketFile = "haproxy.sock"
	LogFile    = "haproxy.log"
)

// Backend is one control plane.
type Backend struct {
	Name string
	Addr netip.Addr
}

// Config is a balancer.
type Config struct {
	// Dir holds its configuration, its admin socket and its log.
	Dir string
	// Address is where it listens; each of Ports goes to the same port of
	// every backend.
	Address  netip.Addr
	Ports    []uint16
	Backends []Backend
	// CheckEvery is how often it checks each backend with a TCP connect:
	// a backend that fails three checks in a row takes no new
	// connections, and its open ones are cut (so that a client dials
	// again and reaches another); two passes bring it back. Zero means 2
	// s, so that a lost control plane is out within about 6 s. A connect
	// needs nothing of the server's process: an HTTPS check of the API
	// server's /readyz, as real clouds' health checks ask it, took the
	// only control plane of an emulated (TCG) cluster out again and again
	// while it served, its TLS handshakes being as slow as kubectl's
	// (which timed out after 10 s), and every request through the
	// balancer then ended in EOF.
	CheckEvery time.Duration
	// ExecPrefix runs HAProxy inside the cloud's network namespace.
	ExecPrefix []string
	// Binary is HAProxy's; empty means haproxy from PATH.
	Binary string
}

var configTemplate = template.Must(template.New(ConfigFile).Parse(`# Written by Orrery's local cloud: the load balancer in front of its
# control planes. Plain TCP: TLS runs end to end.
global
    log stderr format iso local0
    stats socket {{.Socket}} mode 600 level admin
    maxconn 4096

defaults
    mode tcp
    log global
    option tcplog
    timeout connect 2s
    # Watches of the API server stay open for long.
    timeout client 1h
    timeout server 1h
    retries 3
    option redispatch
{{range $p := .Ports}}
frontend port-{{$p}}
    bind {{$.Address}}:{{$p}}
    default_backend port-{{$p}}

backend port-{{$p}}
    default-server check inter {{$.Every}} fall 3 rise 2 on-marked-down shutdown-sessions
{{- range $.Backends}}
    server {{.Name}} {{.Addr}}:{{$p}}
{{- end}}
{{end}}`))

// Render returns HAProxy's configuration for c.
func Render(c Config) ([]byte, error) {
	if !c.Address.IsValid() || len(c.Ports) == 0 || len(c.Backends) == 0 {
		return nil, errors.New("loadbalancer: an address, a port and a backend are needed")
	}
	for _, b := range c.Backends {
		if b.Name == "" || strings.ContainsAny(b.Name, " \t\n#") || !b.Addr.IsValid() {
			return nil, fmt.Errorf("loadbalancer: backend %q at %v: want a name without spaces and an address", b.Name, b.Addr)
		}
	}
	every := c.CheckEvery
	if every == 0 {
		every = 2 * time.Second
	}
	var buf bytes.Buffer
	err := configTemplate.Execute(&buf, struct {
		Config
		Socket string
		Every  string
	}{c, filepath.Join(c.Dir, SocketFile), strconv.FormatInt(every.Milliseconds(), 10) + "ms"})
	return buf.Bytes(), err
}

// Balancer is a running HAProxy.
type Balancer struct {
	c    Config
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start writes c's configuration, has HAProxy check it, and starts it in
// the foreground; it returns once HAProxy answers on its admin socket.
func Start(ctx context.Context, c Config) (*Balancer, error) {
	cfg, err := Render(c)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(c.Dir, ConfigFile)
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		return nil, err
	}
	bin := c.Binary
	if bin == "" {
		bin = "haproxy"
	}
	args := append(append([]string{}, c.ExecPrefix...), bin)
	if out, err := exec.CommandContext(ctx, args[0], append(args[1:], "-c", "-q", "-f", path)...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy refused the load balancer's configuration %s: %v: %s", path, err, bytes.TrimSpace(out))
	}
	log, err := os.OpenFile(filepath.Join(c.Dir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	// -db: in the foreground, so that the cloud owns the process; -Ws
	// would fork.
	// HAProxy outlives Start's ctx: Stop ends it.
	cmd := exec.CommandContext(context.WithoutCancel(ctx), args[0], append(args[1:], "-db", "-f", path)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start haproxy: %w", err)
	}
	b := &Balancer{c: c, cmd: cmd, done: make(chan struct{})}
	go func() { b.err = cmd.Wait(); close(b.done) }()
	for {
		if _, err := b.Servers(ctx); err == nil {
			return b, nil
		}
		select {
		case <-b.done:
			return nil, fmt.Errorf("haproxy exited at start (%v); the end of %s:\n%s", b.err, filepath.Join(c.Dir, LogFile), logTail(filepath.Join(c.Dir, LogFile), 5))
		case <-ctx.Done():
			b.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logTail is the last n lines of the log at path.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// PID is HAProxy's process.
func (b *Balancer) PID() int { return b.cmd.Process.Pid }

// Stop stops HAProxy, cutting its connections, and waits for it.
func (b *Balancer) Stop() {
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

// Server is what the balancer knows of one backend on one port.
type Server struct {
	Port uint16
	Name string
	// Up says the backend passes its health check.
	Up bool
	// Status is HAProxy's word for it: UP, DOWN, "DOWN 1/2" (coming
	// back), "UP 1/3" (going)...
	Status string
}

// Servers asks HAProxy, on its admin socket, for the state of every
// backend on every port.
func (b *Balancer) Servers(ctx context.Context) ([]Server, error) { return ServersIn(ctx, b.c.Dir) }

// ServersIn asks the balancer whose files are in dir (Config.Dir), from
// any process of the machine: its admin socket is a file, in no network
// namespace.
func ServersIn(ctx context.Context, dir string) ([]Server, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(dir, SocketFile))
	if err != nil {
		return nil, fmt.Errorf("haproxy's admin socket: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "show stat\n"); err != nil {
		return nil, err
	}
	return parseStat(bufio.NewReader(conn))
}

// parseStat reads HAProxy's "show stat" CSV: a header line "# pxname,
// svname,...", then a line per frontend, server and backend.
func parseStat(r io.Reader) ([]Server, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	text := strings.TrimPrefix(strings.TrimSpace(string(raw)), "# ")
	rows, err := csv.NewReader(strings.NewReader(text)).ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("haproxy's stats: %q is no CSV with a header", text)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	px, sv, st, ok := col["pxname"], col["svname"], col["status"], true
	for _, name := range []string{"pxname", "svname", "status"} {
		_, has := col[name]
		ok = ok && has
	}
	if !ok {
		return nil, fmt.Errorf("haproxy's stats lack pxname, svname or status: %q", rows[0])
	}
	var out []Server
	for _, row := range rows[1:] {
		if len(row) != len(rows[0]) || row[sv] == "FRONTEND" || row[sv] == "BACKEND" {
			continue
		}
		port, err := strconv.ParseUint(strings.TrimPrefix(row[px], "port-"), 10, 16)
		if err != nil {
			continue
		}
		out = append(out, Server{Port: uint16(port), Name: row[sv], Status: row[st], Up: strings.HasPrefix(row[st], "UP")})
	}
	return out, nil
}
