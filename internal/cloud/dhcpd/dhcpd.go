// Package dhcpd is the local cloud's DHCPv4 server: it hands every VM the
// fixed address, hostname and routes the harness chose for it, and nothing
// to anyone else.
//
// The server binds to one interface (the bridge) by name, so it must be
// started inside that interface's network namespace (netenv.Network.Do).
// It keeps no lease state: each MAC address has exactly one address, so a
// renewal or a reboot always gets the same answer.
package dhcpd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/orrery-dev/orrery/internal/metadata"
)

// DefaultMetadataIP is the metadata API's address that VMs are routed to
// when Config.MetadataIP is zero; clouds use the same one.
var DefaultMetadataIP = netip.MustParseAddr(metadata.Address)

// DefaultLeaseTime is the lease time when Config.LeaseTime is zero.
const DefaultLeaseTime = time.Hour

// Lease is the fixed address of one VM.
type Lease struct {
	// MAC is the VM's Ethernet address (6 bytes).
	MAC net.HardwareAddr
	// IP is the VM's address, inside Config.Prefix.
	IP netip.Addr
	// Hostname is sent in the host name option; empty sends none.
	Hostname string
}

// Config configures the server.
type Config struct {
	// Interface is the interface to serve on, e.g. the bridge "orrery0".
	Interface string
	// ServerIP is the server's own address on Interface; clients see it as
	// the server identifier.
	ServerIP netip.Addr
	// Prefix is the subnet, for the subnet mask option; host bits are
	// ignored (10.42.0.1/16 and 10.42.0.0/16 are the same).
	Prefix netip.Prefix
	// Router is the clients' default gateway and the next hop to the
	// metadata API. Zero means ServerIP.
	Router netip.Addr
	// MetadataIP gets a host route through Router. Zero means
	// DefaultMetadataIP.
	MetadataIP netip.Addr
	// DNS are the name servers clients are given; empty means none. A
	// node needs at least one: CoreDNS refuses to start without an
	// upstream to forward to.
	DNS []netip.Addr
	// LeaseTime is the lease time clients are given. Zero means
	// DefaultLeaseTime.
	LeaseTime time.Duration
	// Leases are the clients served; anyone else is ignored.
	Leases []Lease
	// OnLease, if set, is called after an ACK for a lease was sent, for
	// example to wait until every VM has its address. It may be called
	// from several goroutines at once, and never after Close returns.
	OnLease func(Lease)
	// Logger receives one line per answered or ignored message; nil
	// discards them.
	Logger *slog.Logger
}

// Server is a running DHCP server.
type Server struct {
	cfg    Config
	leases map[string]Lease // by MAC address string
	routes []*dhcpv4.Route
	log    *slog.Logger
	srv    *server4.Server

	served chan struct{} // closed when srv.Serve has returned

	mu       sync.Mutex
	closed   bool
	handlers sync.WaitGroup
}

// Start validates cfg, binds UDP port 67 on cfg.Interface in the calling
// thread's network namespace and serves until Close.
func Start(cfg Config) (*Server, error) {
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	conn, err := server4.NewIPv4UDPConn(cfg.Interface, &net.UDPAddr{Port: dhcpv4.ServerPort})
	if err != nil {
		return nil, fmt.Errorf("listen for DHCP on interface %q: %w (the interface must exist in the current network namespace, and no other DHCP server may hold port 67)", cfg.Interface, err)
	}
	srv, err := server4.NewServer(cfg.Interface, nil, s.handle, server4.WithConn(conn), server4.WithLogger(libLogger{s.log}))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("create DHCP server: %w", err)
	}
	s.srv = srv
	go func() {
		defer close(s.served)
		err := srv.Serve()
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if !closed {
			s.log.Error("DHCP server stopped", "error", err)
		}
	}()
	s.log.Info("DHCP server started", "interface", cfg.Interface, "server", cfg.ServerIP, "leases", len(cfg.Leases))
	return s, nil
}

// newServer validates cfg and fills in defaults, without any socket.
func newServer(cfg Config) (*Server, error) {
	if cfg.Router == (netip.Addr{}) {
		cfg.Router = cfg.ServerIP
	}
	if cfg.MetadataIP == (netip.Addr{}) {
		cfg.MetadataIP = DefaultMetadataIP
	}
	if cfg.LeaseTime == 0 {
		cfg.LeaseTime = DefaultLeaseTime
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Prefix = cfg.Prefix.Masked()
	s := &Server{
		cfg:    cfg,
		leases: make(map[string]Lease, len(cfg.Leases)),
		log:    cfg.Logger,
		served: make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, l := range cfg.Leases {
		s.leases[l.MAC.String()] = l
	}
	router := net.IP(cfg.Router.AsSlice())
	// Clients that understand classless static routes (RFC 3442) must
	// ignore the router option, so the default route is repeated here.
	s.routes = []*dhcpv4.Route{
		{Dest: &net.IPNet{IP: cfg.MetadataIP.AsSlice(), Mask: net.CIDRMask(32, 32)}, Router: router},
		{Dest: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Router: router},
	}
	return s, nil
}

func (c Config) validate() error {
	if c.Interface == "" {
		return errors.New("no interface to serve DHCP on: set Config.Interface, e.g. to the bridge")
	}
	if !c.Prefix.IsValid() || !c.Prefix.Addr().Is4() || c.Prefix.Bits() > 30 {
		return fmt.Errorf("invalid subnet %q: want IPv4 with a prefix of at most /30, e.g. 10.42.0.0/16", c.Prefix)
	}
	subnet := c.Prefix.Masked()
	if err := checkHost(subnet, c.ServerIP); err != nil {
		return fmt.Errorf("invalid server address: %w", err)
	}
	if err := checkHost(subnet, c.Router); err != nil {
		return fmt.Errorf("invalid router: %w", err)
	}
	if !c.MetadataIP.Is4() {
		return fmt.Errorf("invalid metadata address %s: want IPv4, e.g. %s", c.MetadataIP, DefaultMetadataIP)
	}
	if c.LeaseTime < time.Second || c.LeaseTime > math.MaxUint32*time.Second {
		return fmt.Errorf("invalid lease time %s: want between 1s and 136 years", c.LeaseTime)
	}
	macs := map[string]bool{}
	ips := map[netip.Addr]bool{}
	for i, l := range c.Leases {
		if len(l.MAC) != 6 {
			return fmt.Errorf("lease %d: invalid MAC address %q: want 6 bytes (Ethernet)", i, l.MAC)
		}
		if err := checkHost(subnet, l.IP); err != nil {
			return fmt.Errorf("lease %d (%s): %w", i, l.MAC, err)
		}
		if l.IP == c.ServerIP || l.IP == c.Router {
			return fmt.Errorf("lease %d (%s): address %s is the server's or the router's: pick another", i, l.MAC, l.IP)
		}
		if l.Hostname != "" && !validHostname(l.Hostname) {
			return fmt.Errorf("lease %d (%s): invalid hostname %q: use letters, digits and '-' in dot-separated labels", i, l.MAC, l.Hostname)
		}
		if macs[l.MAC.String()] {
			return fmt.Errorf("lease %d: MAC address %s appears twice: give each VM its own", i, l.MAC)
		}
		if ips[l.IP] {
			return fmt.Errorf("lease %d (%s): address %s appears twice: give each VM its own", i, l.MAC, l.IP)
		}
		macs[l.MAC.String()] = true
		ips[l.IP] = true
	}
	return nil
}

// checkHost checks that ip is a usable host address of subnet.
func checkHost(subnet netip.Prefix, ip netip.Addr) error {
	if !ip.Is4() {
		return fmt.Errorf("%q is not an IPv4 address", ip)
	}
	if !subnet.Contains(ip) {
		return fmt.Errorf("%s is outside the subnet %s", ip, subnet)
	}
	if ip == subnet.Addr() || ip == broadcastAddr(subnet) {
		return fmt.Errorf("%s is the network or broadcast address of %s", ip, subnet)
	}
	return nil
}

func broadcastAddr(subnet netip.Prefix) netip.Addr {
	b := subnet.Addr().As4()
	host := uint32(1)<<(32-subnet.Bits()) - 1
	for i := range 4 {
		b[i] |= byte(host >> (24 - 8*i))
	}
	return netip.AddrFrom4(b)
}

// validHostname accepts RFC 1123 host names.
func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// Close stops the server and waits for messages being answered.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.srv.Close()
	<-s.served
	s.handlers.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close DHCP socket: %w", err)
	}
	return nil
}

// handle is called by server4 on a goroutine of its own per message.
func (s *Server) handle(conn net.PacketConn, _ net.Addr, req *dhcpv4.DHCPv4) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()

	log := s.log.With("mac", req.ClientHWAddr.String(), "type", req.MessageType().String(), "xid", req.TransactionID.String())
	a := s.answer(req)
	if a.resp == nil {
		level := slog.LevelDebug
		if a.warn {
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, "DHCP message ignored", "reason", a.why)
		return
	}
	if _, err := conn.WriteTo(a.resp.ToBytes(), a.dest); err != nil {
		log.Warn("send DHCP reply", "error", err, "to", a.dest.String())
		return
	}
	if a.why != "" {
		log = log.With("reason", a.why)
	}
	log.Info("DHCP reply sent", "reply", a.resp.MessageType().String(), "ip", a.resp.YourIPAddr.String())
	if a.acked != nil && s.cfg.OnLease != nil {
		s.cfg.OnLease(*a.acked)
	}
}

// answer is what the server does about one message.
type answer struct {
	resp  *dhcpv4.DHCPv4 // nil: send nothing
	dest  *net.UDPAddr
	acked *Lease // set for an ACK that hands out a lease
	why   string // for the log
	warn  bool   // log an ignored message as a warning
}

var broadcast = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}

// answer decides the reply to req. It has no side effects, so tests can
// call it without a network.
func (s *Server) answer(req *dhcpv4.DHCPv4) answer {
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return answer{why: "not a client request"}
	}
	if ip := req.GatewayIPAddr; ip != nil && !ip.IsUnspecified() {
		// The VMs sit on our bridge; a relayed message comes from elsewhere.
		return answer{why: "relayed messages are not served"}
	}
	lease, ok := s.leases[req.ClientHWAddr.String()]
	if !ok {
		return answer{why: "unknown MAC address"}
	}
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		return s.reply(req, dhcpv4.MessageTypeOffer, lease, "")
	case dhcpv4.MessageTypeRequest:
		if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(s.cfg.ServerIP.AsSlice()) {
			return answer{why: fmt.Sprintf("client chose server %s", sid)}
		}
		// SELECTING and INIT-REBOOT clients name the address in an
		// option; RENEWING and REBINDING ones in ciaddr.
		want := req.RequestedIPAddress()
		if want == nil {
			want = req.ClientIPAddr
		}
		got, ok := netip.AddrFromSlice(want.To4())
		if !ok || got.IsUnspecified() {
			return s.reply(req, dhcpv4.MessageTypeNak, lease, "no address requested")
		}
		if got != lease.IP {
			return s.reply(req, dhcpv4.MessageTypeNak, lease, fmt.Sprintf("requested %s, but this client's address is %s", got, lease.IP))
		}
		return s.reply(req, dhcpv4.MessageTypeAck, lease, "")
	case dhcpv4.MessageTypeInform:
		return s.reply(req, dhcpv4.MessageTypeAck, lease, "")
	case dhcpv4.MessageTypeDecline:
		// Someone else uses the address: a harness bug worth a loud log,
		// but no other address could be offered anyway.
		return answer{why: "client declined its address: another host uses " + lease.IP.String(), warn: true}
	case dhcpv4.MessageTypeRelease:
		return answer{why: "client released its address"}
	default:
		return answer{why: "message type not served"}
	}
}

func (s *Server) reply(req *dhcpv4.DHCPv4, typ dhcpv4.MessageType, lease Lease, nakMsg string) answer {
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP.AsSlice())),
	}
	inform := req.MessageType() == dhcpv4.MessageTypeInform
	switch {
	case typ == dhcpv4.MessageTypeNak:
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptMessage(nakMsg)))
	default:
		mods = append(mods,
			dhcpv4.WithNetmask(net.CIDRMask(s.cfg.Prefix.Bits(), 32)),
			dhcpv4.WithRouter(s.cfg.Router.AsSlice()),
			dhcpv4.WithOption(dhcpv4.OptClasslessStaticRoute(s.routes...)),
		)
		if lease.Hostname != "" {
			mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(lease.Hostname)))
		}
		if len(s.cfg.DNS) > 0 {
			var dns []net.IP
			for _, a := range s.cfg.DNS {
				dns = append(dns, a.AsSlice())
			}
			mods = append(mods, dhcpv4.WithDNS(dns...))
		}
		// RFC 2131 4.3.5: an answer to INFORM carries no address and no
		// lease time, as the client configured its address itself.
		if !inform {
			mods = append(mods,
				dhcpv4.WithYourIP(lease.IP.AsSlice()),
				dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(s.cfg.LeaseTime)),
			)
		}
	}
	resp, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		// Only fails if no random transaction ID could be made; the
		// reply reuses the request's, so this cannot happen in practice.
		return answer{why: fmt.Sprintf("build reply: %v", err)}
	}
	// A NAK goes to everyone, as the client may think it has an address
	// it must not use; a client with an address gets its answer there;
	// one without cannot receive unicast before it knows its address.
	dest := broadcast
	if ci := req.ClientIPAddr; typ != dhcpv4.MessageTypeNak && ci != nil && !ci.IsUnspecified() {
		dest = &net.UDPAddr{IP: ci, Port: dhcpv4.ClientPort}
	}
	a := answer{resp: resp, dest: dest, why: nakMsg}
	if typ == dhcpv4.MessageTypeAck && !inform {
		a.acked = &lease
	}
	return a
}

// libLogger sends server4's own messages to the debug level.
type libLogger struct{ log *slog.Logger }

func (l libLogger) PrintMessage(prefix string, m *dhcpv4.DHCPv4) {
	l.log.Debug(prefix, "message", m.String())
}

func (l libLogger) Printf(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("DHCP library", "detail", fmt.Sprintf(format, v...))
	}
}
