package dhcpd

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a server or client
// goroutine running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	testMAC      = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	otherMAC     = net.HardwareAddr{0x52, 0x54, 0x00, 0x65, 0x43, 0x21}
	testLease    = Lease{MAC: testMAC, IP: netip.MustParseAddr("10.42.0.10"), Hostname: "cp-0"}
	serverIP     = netip.MustParseAddr("10.42.0.1")
	testLeaseOth = Lease{MAC: otherMAC, IP: netip.MustParseAddr("10.42.0.11")}
)

func testConfig() Config {
	return Config{
		Interface: "orrery0",
		ServerIP:  serverIP,
		Prefix:    netip.MustParsePrefix("10.42.0.0/16"),
		LeaseTime: 10 * time.Minute,
		Leases:    []Lease{testLease, testLeaseOth},
	}
}

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		change  func(*Config)
		wantErr bool
	}{
		"valid":                       {change: func(*Config) {}},
		"prefix with host bits":       {change: func(c *Config) { c.Prefix = netip.MustParsePrefix("10.42.0.1/16") }},
		"no leases":                   {change: func(c *Config) { c.Leases = nil }},
		"no interface":                {change: func(c *Config) { c.Interface = "" }, wantErr: true},
		"no prefix":                   {change: func(c *Config) { c.Prefix = netip.Prefix{} }, wantErr: true},
		"IPv6 prefix":                 {change: func(c *Config) { c.Prefix = netip.MustParsePrefix("fd00::/64") }, wantErr: true},
		"prefix /31":                  {change: func(c *Config) { c.Prefix = netip.MustParsePrefix("10.42.0.0/31") }, wantErr: true},
		"server outside subnet":       {change: func(c *Config) { c.ServerIP = netip.MustParseAddr("10.43.0.1") }, wantErr: true},
		"no server address":           {change: func(c *Config) { c.ServerIP = netip.Addr{} }, wantErr: true},
		"router outside subnet":       {change: func(c *Config) { c.Router = netip.MustParseAddr("10.43.0.1") }, wantErr: true},
		"IPv6 metadata address":       {change: func(c *Config) { c.MetadataIP = netip.MustParseAddr("fd00::1") }, wantErr: true},
		"negative lease time":         {change: func(c *Config) { c.LeaseTime = -time.Second }, wantErr: true},
		"lease time beyond 32 bits":   {change: func(c *Config) { c.LeaseTime = 200 * 365 * 24 * time.Hour }, wantErr: true},
		"short MAC":                   {change: func(c *Config) { c.Leases[0].MAC = testMAC[:4] }, wantErr: true},
		"lease outside subnet":        {change: func(c *Config) { c.Leases[0].IP = netip.MustParseAddr("10.43.0.10") }, wantErr: true},
		"lease on network address":    {change: func(c *Config) { c.Leases[0].IP = netip.MustParseAddr("10.42.0.0") }, wantErr: true},
		"lease on broadcast address":  {change: func(c *Config) { c.Leases[0].IP = netip.MustParseAddr("10.42.255.255") }, wantErr: true},
		"lease on server address":     {change: func(c *Config) { c.Leases[0].IP = serverIP }, wantErr: true},
		"duplicate MAC":               {change: func(c *Config) { c.Leases[1].MAC = testMAC }, wantErr: true},
		"duplicate IP":                {change: func(c *Config) { c.Leases[1].IP = testLease.IP }, wantErr: true},
		"hostname with underscore":    {change: func(c *Config) { c.Leases[0].Hostname = "cp_0" }, wantErr: true},
		"hostname with leading dash":  {change: func(c *Config) { c.Leases[0].Hostname = "-cp" }, wantErr: true},
		"hostname with empty label":   {change: func(c *Config) { c.Leases[0].Hostname = "cp..local" }, wantErr: true},
		"hostname label of 64 bytes":  {change: func(c *Config) { c.Leases[0].Hostname = strings.Repeat("a", 64) }, wantErr: true},
		"dotted hostname":             {change: func(c *Config) { c.Leases[0].Hostname = "cp-0.orrery.internal" }},
		"hostname label of 63 bytes":  {change: func(c *Config) { c.Leases[0].Hostname = strings.Repeat("a", 63) }},
		"explicit router and timeout": {change: func(c *Config) { c.Router = netip.MustParseAddr("10.42.0.2") }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Leases = slices.Clone(cfg.Leases)
			tc.change(&cfg)
			_, err := newServer(cfg)
			if (err != nil) != tc.wantErr {
				t.Fatalf("newServer() = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

func TestBroadcastAddr(t *testing.T) {
	tests := map[string]struct{ prefix, want string }{
		"/16": {"10.42.0.0/16", "10.42.255.255"},
		"/24": {"192.168.7.0/24", "192.168.7.255"},
		"/30": {"10.0.0.4/30", "10.0.0.7"},
		"/0":  {"0.0.0.0/0", "255.255.255.255"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := broadcastAddr(netip.MustParsePrefix(tc.prefix)); got.String() != tc.want {
				t.Errorf("broadcastAddr(%s) = %s, want %s", tc.prefix, got, tc.want)
			}
		})
	}
}

// request builds a client message.
func request(t *testing.T, typ dhcpv4.MessageType, mac net.HardwareAddr, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(typ)}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// answerCase is one message TestAnswer feeds to the server and what it
// expects back.
type answerCase struct {
	req       *dhcpv4.DHCPv4
	wantType  dhcpv4.MessageType // zero: no reply
	wantYour  net.IP             // nil: 0.0.0.0
	wantDest  string
	wantLease bool // an ACK that hands out the lease
}

// answerCases builds the client messages for TestAnswer.
func answerCases(t *testing.T) map[string]answerCase {
	t.Helper()
	leaseIP := net.IP(testLease.IP.AsSlice())
	ours := dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice()))
	return map[string]answerCase{
		"discover":                {req: request(t, dhcpv4.MessageTypeDiscover, testMAC), wantType: dhcpv4.MessageTypeOffer, wantYour: leaseIP, wantDest: "255.255.255.255:68"},
		"discover by unknown MAC": {req: request(t, dhcpv4.MessageTypeDiscover, net.HardwareAddr{2, 0, 0, 0, 0, 1})},
		"request selecting": {
			req:      request(t, dhcpv4.MessageTypeRequest, testMAC, ours, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(leaseIP))),
			wantType: dhcpv4.MessageTypeAck, wantYour: leaseIP, wantDest: "255.255.255.255:68", wantLease: true,
		},
		"request init-reboot": {
			req:      request(t, dhcpv4.MessageTypeRequest, testMAC, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(leaseIP))),
			wantType: dhcpv4.MessageTypeAck, wantYour: leaseIP, wantDest: "255.255.255.255:68", wantLease: true,
		},
		"request renewing": {
			req:      request(t, dhcpv4.MessageTypeRequest, testMAC, dhcpv4.WithClientIP(leaseIP)),
			wantType: dhcpv4.MessageTypeAck, wantYour: leaseIP, wantDest: "10.42.0.10:68", wantLease: true,
		},
		"request for a wrong address": {
			req:      request(t, dhcpv4.MessageTypeRequest, testMAC, ours, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 42, 0, 99)))),
			wantType: dhcpv4.MessageTypeNak, wantDest: "255.255.255.255:68",
		},
		"renewing a wrong address": {
			req:      request(t, dhcpv4.MessageTypeRequest, testMAC, dhcpv4.WithClientIP(net.IPv4(10, 42, 0, 99))),
			wantType: dhcpv4.MessageTypeNak, wantDest: "255.255.255.255:68",
		},
		"request without address": {
			req:      request(t, dhcpv4.MessageTypeRequest, testMAC, ours),
			wantType: dhcpv4.MessageTypeNak, wantDest: "255.255.255.255:68",
		},
		"request to another server": {
			req: request(t, dhcpv4.MessageTypeRequest, testMAC, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 42, 0, 2))), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(leaseIP))),
		},
		"request by unknown MAC": {
			req: request(t, dhcpv4.MessageTypeRequest, net.HardwareAddr{2, 0, 0, 0, 0, 1}, ours, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(leaseIP))),
		},
		"inform": {
			req:      request(t, dhcpv4.MessageTypeInform, testMAC, dhcpv4.WithClientIP(leaseIP)),
			wantType: dhcpv4.MessageTypeAck, wantDest: "10.42.0.10:68",
		},
		"release": {req: request(t, dhcpv4.MessageTypeRelease, testMAC, dhcpv4.WithClientIP(leaseIP))},
		"decline": {req: request(t, dhcpv4.MessageTypeDecline, testMAC)},
		"relayed": {req: request(t, dhcpv4.MessageTypeDiscover, testMAC, dhcpv4.WithGatewayIP(net.IPv4(10, 1, 0, 1)))},
		"server reply": {
			req: request(t, dhcpv4.MessageTypeOffer, testMAC, func(d *dhcpv4.DHCPv4) { d.OpCode = dhcpv4.OpcodeBootReply }),
		},
	}
}

func TestAnswer(t *testing.T) {
	s, err := newServer(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range answerCases(t) {
		t.Run(name, func(t *testing.T) { checkAnswer(t, s, tc) })
	}
}

// checkAnswer checks the server's answer to tc.req.
func checkAnswer(t *testing.T, s *Server, tc answerCase) {
	a := s.answer(tc.req)
	if tc.wantType == 0 {
		if a.resp != nil {
			t.Fatalf("answer = %s, want none", a.resp.Summary())
		}
		if a.why == "" {
			t.Error("no reason given for ignoring the message")
		}
		return
	}
	if a.resp == nil {
		t.Fatalf("no answer (%s), want %s", a.why, tc.wantType)
	}
	// Check what goes on the wire.
	resp, err := dhcpv4.FromBytes(a.resp.ToBytes())
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.MessageType(); got != tc.wantType {
		t.Errorf("type = %s, want %s", got, tc.wantType)
	}
	if a.dest.String() != tc.wantDest {
		t.Errorf("destination = %s, want %s", a.dest, tc.wantDest)
	}
	if resp.TransactionID != tc.req.TransactionID || resp.OpCode != dhcpv4.OpcodeBootReply {
		t.Errorf("reply xid %s op %s, want xid %s op BootReply", resp.TransactionID, resp.OpCode, tc.req.TransactionID)
	}
	want := tc.wantYour
	if want == nil {
		want = net.IPv4zero
	}
	if !resp.YourIPAddr.Equal(want) {
		t.Errorf("yiaddr = %s, want %s", resp.YourIPAddr, want)
	}
	if (a.acked != nil) != tc.wantLease {
		t.Errorf("hands out lease = %v, want %v", a.acked != nil, tc.wantLease)
	}
	if !resp.ServerIdentifier().Equal(serverIP.AsSlice()) {
		t.Errorf("server identifier = %s, want %s", resp.ServerIdentifier(), serverIP)
	}
	if tc.wantType == dhcpv4.MessageTypeNak {
		if resp.Message() == "" {
			t.Error("NAK without a message")
		}
		if len(resp.Router()) != 0 || resp.HostName() != "" {
			t.Error("NAK carries configuration options")
		}
		return
	}
	checkOptions(t, resp, testLease.Hostname, tc.wantLease || tc.wantType == dhcpv4.MessageTypeOffer)
}

// checkOptions checks the configuration every OFFER and ACK carries.
func checkOptions(t *testing.T, resp *dhcpv4.DHCPv4, hostname string, wantLeaseTime bool) {
	t.Helper()
	if got := resp.SubnetMask(); got.String() != "ffff0000" {
		t.Errorf("subnet mask = %s, want ffff0000", got)
	}
	if got := resp.Router(); len(got) != 1 || !got[0].Equal(serverIP.AsSlice()) {
		t.Errorf("router = %v, want [%s]", got, serverIP)
	}
	if got := resp.HostName(); got != hostname {
		t.Errorf("hostname = %q, want %q", got, hostname)
	}
	var routes []string
	for _, r := range resp.ClasslessStaticRoute() {
		routes = append(routes, r.String())
	}
	wantRoutes := []string{"route to 169.254.169.254/32 via 10.42.0.1", "route to 0.0.0.0/0 via 10.42.0.1"}
	if !slices.Equal(routes, wantRoutes) {
		t.Errorf("classless routes = %q, want %q", routes, wantRoutes)
	}
	gotLease := resp.Options.Has(dhcpv4.OptionIPAddressLeaseTime)
	if gotLease != wantLeaseTime {
		t.Errorf("lease time option present = %v, want %v", gotLease, wantLeaseTime)
	}
	if wantLeaseTime {
		if got := resp.IPAddressLeaseTime(0); got != 10*time.Minute {
			t.Errorf("lease time = %s, want 10m", got)
		}
	}
}
