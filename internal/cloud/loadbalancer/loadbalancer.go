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

	"github.com/orrery-dev/orrery/internal/childproc"
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
	// CheckEvery is how often it checks each backend (a TCP connect, or
	// ReadyPaths): a backend that fails three checks in a row takes no
	// new connections, and its open ones are cut (so that a client dials
	// again and reaches another); two passes bring it back. Zero means
	// defaultCheckEvery.
	CheckEvery time.Duration
	// ReadyPaths name, per port, the HTTPS path a backend must answer
	// with 200 to take new connections, instead of a TCP connect: the
	// API server's /readyz. A joining control plane's API server listens
	// long before it serves (under TCG its own TLS handshakes timed out
	// for more than 10 min), and a TCP check sent it every other
	// connection meanwhile. When no backend passes, every one takes
	// connections rather than none: under TCG the check of a lone control
	// plane that served failed again and again, its TLS handshakes as
	// slow as the check's timeout, and every request through the balancer
	// ended in EOF.
	ReadyPaths map[uint16]string
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
{{- with index $.ReadyPaths $p}}
    # A backend takes connections once it answers {{.}} with 200 over TLS
    # (unverified: the answer is no secret, and the balancer is trusted
    # with nothing).
    option httpchk GET {{.}}
    http-check expect status 200
    timeout check {{$.CheckTimeout}}
    default-server check check-ssl verify none inter {{$.Every}} fall 3 rise 2 on-marked-down shutdown-sessions
{{- range $.Backends}}
    server {{.Name}} {{.Addr}}:{{$p}}
{{- end}}
    # With none ready, all of them: a slow cluster beats no cluster.
    option allbackups
{{- range $.Backends}}
    server {{.Name}}{{$.FallbackSuffix}} {{.Addr}}:{{$p}} backup no-check
{{- end}}
{{- else}}
    default-server check inter {{$.Every}} fall 3 rise 2 on-marked-down shutdown-sessions
{{- range $.Backends}}
    server {{.Name}} {{.Addr}}:{{$p}}
{{- end}}
{{- end}}
{{end}}`))

// fallbackSuffix names a backend's unchecked twin, which takes
// connections only while no backend passes its readiness check.
const fallbackSuffix = ".fallback"

// defaultCheckEvery is GCP's default health-check interval. A lost control
// plane is out within 15 s of its last answer. Each check of an API
// server is a new TLS handshake and a /readyz that reads from etcd, which
// an emulated control plane pays about 20 times over (ENVIRONMENT.md):
// every 2 s the balancer asked each API server five times as often as
// kubelet's readiness probe does (every 10 s, bootstrapperd's kubeadm
// patches).
const defaultCheckEvery = 5 * time.Second

// checkTimeout bounds one readiness check once connected: an emulated
// API server's TLS handshake alone can take several seconds.
const checkTimeout = 10 * time.Second

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
		every = defaultCheckEvery
	}
	var buf bytes.Buffer
	for port, path := range c.ReadyPaths {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t\n#") {
			return nil, fmt.Errorf("loadbalancer: readiness path %q for port %d: want an absolute path without spaces", path, port)
		}
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }
	err := configTemplate.Execute(&buf, struct {
		Config
		Socket, Every, CheckTimeout, FallbackSuffix string
	}{c, filepath.Join(c.Dir, SocketFile), ms(every), ms(checkTimeout), fallbackSuffix})
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
	// childproc: with a plain Start the SIGTERM is bound to whichever
	// thread forked, and the cloud's network-namespace helper ends
	// threads; HAProxy then stopped listening in the middle of a run.
	wait, err := childproc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start haproxy: %w", err)
	}
	b := &Balancer{c: c, cmd: cmd, done: make(chan struct{})}
	go func() { b.err = <-wait; close(b.done) }()
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
		if err != nil || strings.HasSuffix(row[sv], fallbackSuffix) {
			continue
		}
		out = append(out, Server{Port: uint16(port), Name: row[sv], Status: row[st], Up: strings.HasPrefix(row[st], "UP")})
	}
	return out, nil
}
