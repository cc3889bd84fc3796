package dhcpd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/cloud/netenv"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
)

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// inNamespace runs fn on a thread inside the named namespace; the thread
// is thrown away afterwards (see netenv.Network.Do).
func inNamespace(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// nsServer is a server running on a bridge in one namespace, with a
// client namespace attached to the bridge.
type nsServer struct {
	ctx      context.Context
	clientNS string
	lease    Lease
	leased   chan Lease
	logs     *syncbuffer.Buffer
}

// TestServeInNamespace runs the server on a bridge in one namespace and a
// real DHCP client on a veth in another, connected through the bridge.
func TestServeInNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n, clientNS := newNamespaces(t, ctx)
	e := startInNamespace(t, ctx, n, clientNS)

	t.Run("known client", func(t *testing.T) { checkKnownClient(t, e) })
	t.Run("request for a wrong address", func(t *testing.T) { checkWrongAddressNak(t, e) })
	t.Run("unknown client", func(t *testing.T) { checkUnknownClientIgnored(t, e) })

	select {
	case l := <-e.leased:
		t.Errorf("unexpected OnLease(%+v)", l)
	default:
	}
}

// newNamespaces creates the server's network with its bridge and a client
// namespace whose veth is plugged into that bridge.
func newNamespaces(t *testing.T, ctx context.Context) (*netenv.Network, string) {
	t.Helper()
	serverNS := fmt.Sprintf("orrdhcp-%d-srv", os.Getpid())
	clientNS := fmt.Sprintf("orrdhcp-%d-cli", os.Getpid())
	t.Cleanup(func() {
		for _, ns := range []string{clientNS, serverNS} {
			if err := netenv.Cleanup(context.Background(), ns, "orrbr0", ""); err != nil {
				t.Errorf("clean up namespace %s: %v", ns, err)
			}
		}
	})
	n, err := netenv.Create(ctx, netenv.Config{
		Namespace:  serverNS,
		Bridge:     "orrbr0",
		Gateway:    netip.MustParsePrefix("10.233.0.1/24"),
		MetadataIP: DefaultMetadataIP,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Destroy(context.Background()) })
	ip(t, "netns", "add", clientNS)
	ip(t, "-n", serverNS, "link", "add", "vsrv", "type", "veth", "peer", "name", "vcli", "netns", clientNS)
	ip(t, "-n", serverNS, "link", "set", "dev", "vsrv", "master", "orrbr0", "up")
	ip(t, "-n", clientNS, "link", "set", "dev", "vcli", "address", testMAC.String(), "up")
	return n, clientNS
}

// startInNamespace starts the server on the bridge of n with one lease for
// testMAC.
func startInNamespace(t *testing.T, ctx context.Context, n *netenv.Network, clientNS string) *nsServer {
	t.Helper()
	e := &nsServer{
		ctx:      ctx,
		clientNS: clientNS,
		lease:    Lease{MAC: testMAC, IP: netip.MustParseAddr("10.233.0.10"), Hostname: "cp-0"},
		leased:   make(chan Lease, 10),
		logs:     new(syncbuffer.Buffer),
	}
	var srv *Server
	err := n.Do(func() error {
		var err error
		srv, err = Start(Config{
			Interface: "orrbr0",
			ServerIP:  netip.MustParseAddr("10.233.0.1"),
			Prefix:    netip.MustParsePrefix("10.233.0.0/24"),
			LeaseTime: 10 * time.Minute,
			DNS:       []netip.Addr{netip.MustParseAddr("10.233.0.1")},
			Leases:    []Lease{e.lease},
			OnLease:   func(l Lease) { e.leased <- l },
			Logger:    slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", e.logs.String())
		}
	})
	return e
}

func checkKnownClient(t *testing.T, e *nsServer) {
	ctx, lease := e.ctx, e.lease
	var got *nclient4.Lease
	err := inNamespace(e.clientNS, func() error {
		c, err := nclient4.New("vcli", nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(3))
		if err != nil {
			return err
		}
		defer c.Close()
		got, err = c.Request(ctx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ack := got.ACK
	if !ack.YourIPAddr.Equal(lease.IP.AsSlice()) {
		t.Errorf("address = %s, want %s", ack.YourIPAddr, lease.IP)
	}
	if got := ack.SubnetMask(); got.String() != "ffffff00" {
		t.Errorf("subnet mask = %s, want ffffff00", got)
	}
	if got := ack.Router(); len(got) != 1 || !got[0].Equal(net.IPv4(10, 233, 0, 1)) {
		t.Errorf("router = %v, want [10.233.0.1]", got)
	}
	if got := ack.DNS(); len(got) != 1 || !got[0].Equal(net.IPv4(10, 233, 0, 1)) {
		t.Errorf("DNS = %v, want [10.233.0.1]", got)
	}
	if got := ack.HostName(); got != "cp-0" {
		t.Errorf("hostname = %q, want cp-0", got)
	}
	if got := ack.IPAddressLeaseTime(0); got != 10*time.Minute {
		t.Errorf("lease time = %s, want 10m", got)
	}
	var routes []string
	for _, r := range ack.ClasslessStaticRoute() {
		routes = append(routes, r.String())
	}
	if want := "route to 169.254.169.254/32 via 10.233.0.1"; len(routes) == 0 || routes[0] != want {
		t.Errorf("classless routes = %q, want first %q", routes, want)
	}
	select {
	case l := <-e.leased:
		if l.IP != lease.IP || l.MAC.String() != lease.MAC.String() {
			t.Errorf("OnLease(%+v), want %+v", l, lease)
		}
	case <-time.After(5 * time.Second):
		t.Error("OnLease was not called")
	}
}

func checkWrongAddressNak(t *testing.T, e *nsServer) {
	ctx := e.ctx
	err := inNamespace(e.clientNS, func() error {
		c, err := nclient4.New("vcli", nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(3))
		if err != nil {
			return err
		}
		defer c.Close()
		offer, err := c.DiscoverOffer(ctx)
		if err != nil {
			return err
		}
		offer.YourIPAddr = net.IPv4(10, 233, 0, 99)
		_, err = c.RequestFromOffer(ctx, offer)
		return err
	})
	if nak := new(nclient4.ErrNak); !errors.As(err, &nak) {
		t.Fatalf("request = %v, want a NAK", err)
	}
}

func checkUnknownClientIgnored(t *testing.T, e *nsServer) {
	ctx := e.ctx
	unknown := net.HardwareAddr{0x52, 0x54, 0x00, 0xde, 0xad, 0x01}
	err := inNamespace(e.clientNS, func() error {
		c, err := nclient4.New("vcli", nclient4.WithHWAddr(unknown), nclient4.WithTimeout(300*time.Millisecond), nclient4.WithRetry(2))
		if err != nil {
			return err
		}
		defer c.Close()
		offer, err := c.DiscoverOffer(ctx)
		if err == nil {
			return fmt.Errorf("got an offer of %s", offer.YourIPAddr)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.logs.String(), "unknown MAC address") || !strings.Contains(e.logs.String(), unknown.String()) {
		t.Errorf("log does not mention the unknown MAC %s", unknown)
	}
}
