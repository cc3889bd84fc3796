// Package netenv builds the local cloud's network: a Linux bridge with the
// gateway and metadata addresses, and one tap device per VM, optionally all
// inside a network namespace of their own.
//
// Tests put everything in a fresh namespace so that no packet reaches the
// host's networks; `orrery mini` uses the host namespace so the owner's
// workstation can talk to the VMs. All changes go through the ip(8) command
// of iproute2, which keeps this package free of a netlink library and makes
// every step easy to reproduce by hand.
package netenv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrExists is returned (wrapped) by Create and AddTap when a namespace or
// link of the requested name already exists.
// The wrapping error says how to remove what a run that was killed before
// it cleaned up left behind.
var ErrExists = errors.New("exists: another run is active, or one was stopped before it cleaned up")

// netnsDir is where ip(8) keeps named network namespaces.
const netnsDir = "/run/netns"

// Config describes the network to create.
type Config struct {
	// Namespace is the network namespace to create and put everything in.
	// Empty means the caller's (host) namespace, as for `orrery mini`.
	Namespace string
	// Bridge is the bridge's name, e.g. "orrery0" (at most 15 bytes).
	Bridge string
	// Gateway is the bridge's address with the VM subnet's length,
	// e.g. 10.42.0.1/16.
	Gateway netip.Prefix
	// MetadataIP is an extra /32 address on the bridge on which the
	// metadata API listens, e.g. 169.254.169.254. Zero adds none.
	MetadataIP netip.Addr
	// LoadBalancerIP is a further address of the host's on the bridge,
	// inside the VM subnet, on which the cloud's load balancer in front
	// of the control planes listens, e.g. 10.42.0.2. Zero adds none.
	LoadBalancerIP netip.Addr
}

// Network is a created bridge with its taps. Its methods are safe for
// concurrent use.
type Network struct {
	cfg Config
	ip  ipTool

	mu   sync.Mutex // guards taps
	taps []string

	// nsMu guards nsFile apart from mu, so that fn in Do may call AddTap.
	nsMu sync.RWMutex
	// nsFile keeps the namespace open for Do, so entering it does not
	// depend on its name still being there.
	nsFile *os.File
}

// Create creates the namespace (if cfg.Namespace is set, with its loopback
// up) and the bridge with its addresses, and brings the bridge up. It
// refuses with ErrExists if the namespace, or in the host namespace the
// bridge, already exists. On failure it removes what it created.
func Create(ctx context.Context, cfg Config) (*Network, error) {
	return create(ctx, cfg, execIP{}, openNamespace)
}

// openNamespace opens the file that ip(8) binds a named namespace to.
func openNamespace(name string) (*os.File, error) {
	return os.Open(filepath.Join(netnsDir, name))
}

func create(ctx context.Context, cfg Config, cmd commander, openNS func(string) (*os.File, error)) (n *Network, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n = &Network{cfg: cfg, ip: ipTool{cmd: cmd}}
	ns := cfg.Namespace
	if ns != "" {
		exists, err := n.ip.namespaceExists(ctx, ns)
		if err != nil {
			return nil, fmt.Errorf("list network namespaces: %w", err)
		}
		if exists {
			// A test run keeps its namespace; a run killed mid-way (an
			// interrupted session, go test's timeout) leaves it behind, and
			// its state directory, which 'orrery mini down' needs, is gone.
			return nil, fmt.Errorf("network namespace %q %w; if no run is active, remove it with 'ip netns del %s'", ns, ErrExists, ns)
		}
		if err := n.ip.do(ctx, "", "netns", "add", ns); err != nil {
			return nil, fmt.Errorf("create network namespace: %w", err)
		}
	} else {
		exists, err := n.ip.hasLink(ctx, "", cfg.Bridge)
		if err != nil {
			return nil, fmt.Errorf("list links: %w", err)
		}
		if exists {
			return nil, fmt.Errorf("bridge %q %w; if no run is active, run 'orrery mini down' (or 'ip link del %s')", cfg.Bridge, ErrExists, cfg.Bridge)
		}
	}
	defer func() {
		if err != nil {
			// Leave nothing half-made behind: the next run would refuse.
			if derr := n.Destroy(context.WithoutCancel(ctx)); derr != nil {
				err = errors.Join(err, fmt.Errorf("undo partial network: %w", derr))
			}
			n = nil
		}
	}()
	if ns != "" {
		f, err := openNS(ns)
		if err != nil {
			return n, fmt.Errorf("open network namespace: %w", err)
		}
		n.nsFile = f
		// A new namespace's loopback is down; servers that listen on
		// localhost inside it would not be reachable.
		if err := n.ip.do(ctx, ns, "link", "set", "dev", "lo", "up"); err != nil {
			return n, fmt.Errorf("bring loopback up: %w", err)
		}
	}
	steps := [][]string{
		{"link", "add", "name", cfg.Bridge, "type", "bridge"},
		{"addr", "add", cfg.Gateway.String(), "dev", cfg.Bridge},
	}
	if cfg.MetadataIP.IsValid() {
		steps = append(steps, []string{"addr", "add", netip.PrefixFrom(cfg.MetadataIP, 32).String(), "dev", cfg.Bridge})
	}
	if cfg.LoadBalancerIP.IsValid() {
		// /32: the subnet's route is the gateway's address's already.
		steps = append(steps, []string{"addr", "add", netip.PrefixFrom(cfg.LoadBalancerIP, 32).String(), "dev", cfg.Bridge})
	}
	steps = append(steps, []string{"link", "set", "dev", cfg.Bridge, "up"})
	for _, args := range steps {
		if err := n.ip.do(ctx, ns, args...); err != nil {
			return n, fmt.Errorf("set up bridge: %w", err)
		}
	}
	return n, nil
}

func (c Config) validate() error {
	if c.Namespace != "" && !validName(c.Namespace, 64) {
		return fmt.Errorf("invalid network namespace name %q: use 1-64 letters, digits, '.', '_' or '-'", c.Namespace)
	}
	if !validName(c.Bridge, unix.IFNAMSIZ-1) {
		return fmt.Errorf("invalid bridge name %q: use 1-%d letters, digits, '.', '_' or '-'", c.Bridge, unix.IFNAMSIZ-1)
	}
	if !c.Gateway.IsValid() || !c.Gateway.Addr().Is4() || c.Gateway.Bits() > 30 {
		return fmt.Errorf("invalid gateway %q: want an IPv4 address with a prefix of at most /30, e.g. 10.42.0.1/16", c.Gateway)
	}
	if c.Gateway.Addr() == c.Gateway.Masked().Addr() {
		return fmt.Errorf("invalid gateway %s: it is the subnet's network address; use a host address, e.g. the first one", c.Gateway)
	}
	if c.MetadataIP.IsValid() {
		if !c.MetadataIP.Is4() {
			return fmt.Errorf("invalid metadata address %s: want IPv4, e.g. 169.254.169.254", c.MetadataIP)
		}
		if c.Gateway.Contains(c.MetadataIP) {
			return fmt.Errorf("metadata address %s is inside the VM subnet %s: use one outside it, e.g. 169.254.169.254", c.MetadataIP, c.Gateway.Masked())
		}
	}
	if lb := c.LoadBalancerIP; lb.IsValid() {
		if !c.Gateway.Contains(lb) || lb == c.Gateway.Addr() || lb == c.Gateway.Masked().Addr() {
			return fmt.Errorf("load balancer address %s: want a host address of the VM subnet %s other than the gateway's", lb, c.Gateway.Masked())
		}
	}
	return nil
}

// validName accepts the names that are safe both as Linux interface names
// and as file names under /run/netns: no slashes, spaces or dots alone.
func validName(s string, max int) bool {
	if s == "" || len(s) > max || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

// Config returns the configuration the network was created with.
func (n *Network) Config() Config { return n.cfg }

// AddTap creates a persistent tap device, attaches it to the bridge and
// brings it up. A VM started later (in the same namespace, see ExecPrefix)
// opens it by name.
func (n *Network) AddTap(ctx context.Context, name string) error {
	if !validName(name, unix.IFNAMSIZ-1) {
		return fmt.Errorf("invalid tap name %q: use 1-%d letters, digits, '.', '_' or '-'", name, unix.IFNAMSIZ-1)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	ns := n.cfg.Namespace
	// ip tuntap add quietly reuses an existing persistent tap, which could
	// belong to another run; so look first.
	exists, err := n.ip.hasLink(ctx, ns, name)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	if name == n.cfg.Bridge {
		// Deleting "it" would take this run's own bridge.
		return fmt.Errorf("tap %q has the bridge's name: %w", name, ErrExists)
	}
	if exists {
		del := "ip link del " + name
		if ns != "" {
			del = fmt.Sprintf("ip -n %s link del %s", ns, name)
		}
		return fmt.Errorf("tap %q %w; if no run is active, remove it with '%s'", name, ErrExists, del)
	}
	if err := n.ip.do(ctx, ns, "tuntap", "add", "dev", name, "mode", "tap"); err != nil {
		return fmt.Errorf("create tap: %w", err)
	}
	if err := n.ip.do(ctx, ns, "link", "set", "dev", name, "master", n.cfg.Bridge, "up"); err != nil {
		if derr := n.ip.do(context.WithoutCancel(ctx), ns, "link", "del", "dev", name); derr != nil {
			err = errors.Join(err, fmt.Errorf("undo tap: %w", derr))
		}
		return fmt.Errorf("attach tap to bridge: %w", err)
	}
	n.taps = append(n.taps, name)
	return nil
}

// Taps returns the names of the taps added so far.
func (n *Network) Taps() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.taps)
}

// Do runs fn on an OS thread inside the network's namespace. Sockets that
// fn opens stay in the namespace after Do returns and may be used from any
// goroutine; goroutines that fn starts run outside it. In the host
// namespace Do just calls fn.
//
// Rather than switching the thread back, Do runs fn on a goroutine of its
// own that stays locked to its thread, so the Go runtime ends that thread
// with the goroutine: no thread that has been in the namespace ever runs
// other code, even if fn leaves the thread in an odd state. A panic in fn
// is therefore not recoverable by Do's caller.
func (n *Network) Do(fn func() error) error {
	if n.cfg.Namespace == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread, see above.
		if err := n.enter(); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// enter switches the calling thread into the namespace.
func (n *Network) enter() error {
	n.nsMu.RLock()
	defer n.nsMu.RUnlock()
	if n.nsFile == nil {
		return fmt.Errorf("network namespace %q was destroyed: create the network again", n.cfg.Namespace)
	}
	if err := unix.Setns(int(n.nsFile.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace %q: %w", n.cfg.Namespace, err)
	}
	return nil
}

// ExecPrefix returns the command words that run a program inside the
// namespace ({"ip", "netns", "exec", ns}), or nil in the host namespace. A
// VM's QEMU must run behind it to open its tap.
func (n *Network) ExecPrefix() []string {
	if n.cfg.Namespace == "" {
		return nil
	}
	return []string{ipBinary, "netns", "exec", n.cfg.Namespace}
}

// Destroy deletes the taps, the bridge and the namespace. Missing parts are
// skipped, so it can be called again after a partial failure; it tries
// every step and returns all errors.
func (n *Network) Destroy(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	n.nsMu.Lock()
	if n.nsFile != nil {
		if err := n.nsFile.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close network namespace: %w", err))
		}
		n.nsFile = nil
	}
	n.nsMu.Unlock()
	err := removeLinks(ctx, n.ip, n.cfg.Namespace, n.cfg.Bridge, func(l link) bool {
		return slices.Contains(n.taps, l.Name)
	})
	if err != nil {
		errs = append(errs, err)
	} else {
		n.taps = nil
	}
	if err := removeNamespace(ctx, n.ip, n.cfg.Namespace); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Cleanup removes what a crashed run left behind, by name: in namespace
// (or the host namespace if empty) every tap whose name starts with
// tapPrefix and the bridge, then the namespace itself. An empty tapPrefix
// or bridge removes no taps or no bridge. Only links of the right kind are
// touched, so a prefix cannot delete, say, a physical interface.
func Cleanup(ctx context.Context, namespace, bridge, tapPrefix string) error {
	return cleanup(ctx, ipTool{cmd: execIP{}}, namespace, bridge, tapPrefix)
}

func cleanup(ctx context.Context, ip ipTool, namespace, bridge, tapPrefix string) error {
	err := removeLinks(ctx, ip, namespace, bridge, func(l link) bool {
		return tapPrefix != "" && strings.HasPrefix(l.Name, tapPrefix)
	})
	return errors.Join(err, removeNamespace(ctx, ip, namespace))
}

// removeLinks deletes the bridge and the taps that isOurTap selects from
// namespace ns; a missing namespace has nothing to delete.
func removeLinks(ctx context.Context, ip ipTool, ns, bridge string, isOurTap func(link) bool) error {
	if ns != "" {
		exists, err := ip.namespaceExists(ctx, ns)
		if err != nil {
			return fmt.Errorf("list network namespaces: %w", err)
		}
		if !exists {
			return nil
		}
	}
	ls, err := ip.links(ctx, ns)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, l := range ls {
		switch {
		case l.Name == bridge && !l.isBridge():
			errs = append(errs, fmt.Errorf("link %q %w (kind %q): it was not made by orrery; remove or rename it by hand", l.Name, errNotBridge, l.LinkInfo.Kind))
		case l.Name == bridge, l.isTap() && isOurTap(l):
			if err := ip.do(ctx, ns, "link", "del", "dev", l.Name); err != nil {
				errs = append(errs, fmt.Errorf("delete link: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

func removeNamespace(ctx context.Context, ip ipTool, ns string) error {
	if ns == "" {
		return nil
	}
	exists, err := ip.namespaceExists(ctx, ns)
	if err != nil {
		return fmt.Errorf("list network namespaces: %w", err)
	}
	if !exists {
		return nil
	}
	if err := ip.do(ctx, "", "netns", "del", ns); err != nil {
		return fmt.Errorf("delete network namespace: %w", err)
	}
	return nil
}
