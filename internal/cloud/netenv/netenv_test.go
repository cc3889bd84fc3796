package netenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	good := Config{
		Namespace:  "orrtest-1",
		Bridge:     "orrery0",
		Gateway:    netip.MustParsePrefix("10.42.0.1/16"),
		MetadataIP: netip.MustParseAddr("169.254.169.254"),

		LoadBalancerIP: netip.MustParseAddr("10.42.0.2"),
	}
	tests := map[string]struct {
		change  func(*Config)
		wantErr bool
	}{
		"valid":                  {change: func(*Config) {}},
		"host namespace":         {change: func(c *Config) { c.Namespace = "" }},
		"no metadata address":    {change: func(c *Config) { c.MetadataIP = netip.Addr{} }},
		"bridge name 15 bytes":   {change: func(c *Config) { c.Bridge = "abcdefghijklmno" }},
		"bridge name 16 bytes":   {change: func(c *Config) { c.Bridge = "abcdefghijklmnop" }, wantErr: true},
		"empty bridge name":      {change: func(c *Config) { c.Bridge = "" }, wantErr: true},
		"bridge name with slash": {change: func(c *Config) { c.Bridge = "br/0" }, wantErr: true},
		"bridge name dot dot":    {change: func(c *Config) { c.Bridge = ".." }, wantErr: true},
		"namespace with space":   {change: func(c *Config) { c.Namespace = "a b" }, wantErr: true},
		"namespace with slash":   {change: func(c *Config) { c.Namespace = "../etc" }, wantErr: true},
		"namespace too long":     {change: func(c *Config) { c.Namespace = strings.Repeat("n", 65) }, wantErr: true},
		"no gateway":             {change: func(c *Config) { c.Gateway = netip.Prefix{} }, wantErr: true},
		"IPv6 gateway":           {change: func(c *Config) { c.Gateway = netip.MustParsePrefix("fd00::1/64") }, wantErr: true},
		"gateway /32":            {change: func(c *Config) { c.Gateway = netip.MustParsePrefix("10.42.0.1/32") }, wantErr: true},
		"gateway network addr":   {change: func(c *Config) { c.Gateway = netip.MustParsePrefix("10.42.0.0/16") }, wantErr: true},
		"IPv6 metadata address":  {change: func(c *Config) { c.MetadataIP = netip.MustParseAddr("fd00::254") }, wantErr: true},
		"metadata in subnet":     {change: func(c *Config) { c.MetadataIP = netip.MustParseAddr("10.42.255.254") }, wantErr: true},
		"no load balancer":       {change: func(c *Config) { c.LoadBalancerIP = netip.Addr{} }},
		"balancer outside":       {change: func(c *Config) { c.LoadBalancerIP = netip.MustParseAddr("10.43.0.2") }, wantErr: true},
		"balancer on gateway":    {change: func(c *Config) { c.LoadBalancerIP = netip.MustParseAddr("10.42.0.1") }, wantErr: true},
		"balancer network addr":  {change: func(c *Config) { c.LoadBalancerIP = netip.MustParseAddr("10.42.0.0") }, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := good
			tc.change(&cfg)
			err := cfg.validate()
			if (err != nil) != tc.wantErr {
				t.Fatalf("validate() = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

// fakeIP records ip commands and keeps just enough state (link names and
// kinds per namespace, namespace names) to answer the queries.
type fakeIP struct {
	links   map[string]string // "ns/name" -> kind; "bridge", "tap" or other
	netns   []string
	failOn  string // a command line containing this fails
	changes []string
}

func (f *fakeIP) run(_ context.Context, args ...string) ([]byte, error) {
	line := strings.Join(args, " ")
	if f.failOn != "" && strings.Contains(line, f.failOn) {
		return nil, errors.New("injected failure")
	}
	ns := ""
	if len(args) > 2 && args[0] == "-n" {
		ns, args = args[1], args[2:]
	}
	if f.links == nil {
		f.links = map[string]string{}
	}
	switch {
	case slices.Equal(args, []string{"-j", "-d", "link", "show"}):
		var ls []string
		for key, kind := range f.links {
			lns, name, _ := strings.Cut(key, "/")
			if lns != ns {
				continue
			}
			info := fmt.Sprintf(`{"info_kind":%q}`, kind)
			if kind == "tap" {
				info = `{"info_kind":"tun","info_data":{"type":"tap"}}`
			}
			ls = append(ls, fmt.Sprintf(`{"ifname":%q,"linkinfo":%s}`, name, info))
		}
		return []byte("[" + strings.Join(ls, ",") + "]"), nil
	case slices.Equal(args, []string{"-j", "netns", "list"}):
		var ls []string
		for _, n := range f.netns {
			ls = append(ls, fmt.Sprintf(`{"name":%q}`, n))
		}
		return []byte("[" + strings.Join(ls, ",") + "]"), nil
	}
	f.changes = append(f.changes, line)
	switch {
	case len(args) == 6 && args[0] == "link" && args[1] == "add":
		f.links[ns+"/"+args[3]] = args[5]
	case len(args) == 6 && args[0] == "tuntap" && args[1] == "add":
		f.links[ns+"/"+args[3]] = "tap"
	case len(args) == 4 && args[0] == "link" && args[1] == "del":
		delete(f.links, ns+"/"+args[3])
	case len(args) == 3 && args[0] == "netns" && args[1] == "add":
		f.netns = append(f.netns, args[2])
	case len(args) == 3 && args[0] == "netns" && args[1] == "del":
		f.netns = slices.DeleteFunc(f.netns, func(n string) bool { return n == args[2] })
		for key := range f.links {
			if strings.HasPrefix(key, args[2]+"/") {
				delete(f.links, key)
			}
		}
	}
	return nil, nil
}

func noNamespace(string) (*os.File, error) { return nil, nil }

// TestCreateCommands checks the commands Create and Destroy send, without
// root: the host-namespace mode of `orrery mini` must not be run for real
// in tests, as it would change the host's network.
func TestCreateCommands(t *testing.T) {
	for name, tc := range createCommandsCases() {
		t.Run(name, func(t *testing.T) { checkCreateCommands(t, tc) })
	}
}

// createCommandsCase is one configuration and fake ip state for
// TestCreateCommands, with the commands Create must send.
type createCommandsCase struct {
	cfg         Config
	ip          fakeIP
	wantChanges []string
	wantErr     error
	// wantHint is the clean-up the error must name: a killed run
	// leaves no state directory for 'orrery mini down'.
	wantHint string
}

// createCommandsCases builds the cases afresh on each call, as the fake
// changes its maps while the test runs.
func createCommandsCases() map[string]createCommandsCase {
	gw := netip.MustParsePrefix("10.42.0.1/16")
	md := netip.MustParseAddr("169.254.169.254")
	return map[string]createCommandsCase{
		"host namespace": {
			cfg: Config{Bridge: "orrery0", Gateway: gw, MetadataIP: md, LoadBalancerIP: netip.MustParseAddr("10.42.0.2")},
			ip:  fakeIP{links: map[string]string{"/lo": "loopback"}},
			wantChanges: []string{
				"link add name orrery0 type bridge",
				"addr add 10.42.0.1/16 dev orrery0",
				"addr add 169.254.169.254/32 dev orrery0",
				"addr add 10.42.0.2/32 dev orrery0",
				"link set dev orrery0 up",
			},
		},
		"own namespace": {
			cfg: Config{Namespace: "ns1", Bridge: "orrery0", Gateway: gw},
			ip:  fakeIP{netns: []string{"other"}},
			wantChanges: []string{
				"netns add ns1",
				"-n ns1 link set dev lo up",
				"-n ns1 link add name orrery0 type bridge",
				"-n ns1 addr add 10.42.0.1/16 dev orrery0",
				"-n ns1 link set dev orrery0 up",
			},
		},
		"bridge exists in host namespace": {
			cfg:      Config{Bridge: "orrery0", Gateway: gw},
			ip:       fakeIP{links: map[string]string{"/orrery0": "bridge"}},
			wantErr:  ErrExists,
			wantHint: "run 'orrery mini down' (or 'ip link del orrery0')",
		},
		"namespace exists": {
			cfg:      Config{Namespace: "ns1", Bridge: "orrery0", Gateway: gw},
			ip:       fakeIP{netns: []string{"ns1"}},
			wantErr:  ErrExists,
			wantHint: "remove it with 'ip netns del ns1'",
		},
		"failure removes the bridge again": {
			cfg: Config{Bridge: "orrery0", Gateway: gw},
			ip:  fakeIP{failOn: "addr add"},
			wantChanges: []string{
				"link add name orrery0 type bridge",
				"link del dev orrery0",
			},
		},
		"failure removes the namespace again": {
			cfg: Config{Namespace: "ns1", Bridge: "orrery0", Gateway: gw},
			ip:  fakeIP{failOn: "link set dev orrery0 up"},
			wantChanges: []string{
				"netns add ns1",
				"-n ns1 link set dev lo up",
				"-n ns1 link add name orrery0 type bridge",
				"-n ns1 addr add 10.42.0.1/16 dev orrery0",
				"-n ns1 link del dev orrery0",
				"netns del ns1",
			},
		},
	}
}

func checkCreateCommands(t *testing.T, tc createCommandsCase) {
	_, err := create(t.Context(), tc.cfg, &tc.ip, noNamespace)
	switch {
	case tc.wantErr != nil:
		if !errors.Is(err, tc.wantErr) {
			t.Fatalf("create() = %v, want %v", err, tc.wantErr)
		}
		if !strings.Contains(err.Error(), tc.wantHint) {
			t.Errorf("create() = %v, want it to say %q", err, tc.wantHint)
		}
	case tc.ip.failOn != "":
		if err == nil {
			t.Fatal("create() succeeded despite a failing command")
		}
	case err != nil:
		t.Fatalf("create() = %v", err)
	}
	if !slices.Equal(tc.ip.changes, tc.wantChanges) {
		t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(tc.ip.changes, "\n"), strings.Join(tc.wantChanges, "\n"))
	}
}

func TestCleanupTouchesOnlyOurKinds(t *testing.T) {
	ip := &fakeIP{links: map[string]string{
		"/lo":       "loopback",
		"/orrtap0":  "tap",
		"/orrtap1":  "veth",
		"/orrtun":   "tun",
		"/othertap": "tap",
		"/orrery0":  "bridge",
	}}
	if err := cleanup(t.Context(), ipTool{cmd: ip}, "", "orrery0", "orrtap"); err != nil {
		t.Fatal(err)
	}
	var left []string
	for name := range ip.links {
		left = append(left, name)
	}
	slices.Sort(left)
	if want := []string{"/lo", "/orrtap1", "/orrtun", "/othertap"}; !slices.Equal(left, want) {
		t.Errorf("links left = %q, want %q", left, want)
	}

	ip = &fakeIP{links: map[string]string{"/orrery0": "veth"}}
	err := cleanup(t.Context(), ipTool{cmd: ip}, "", "orrery0", "")
	if !errors.Is(err, errNotBridge) {
		t.Errorf("cleanup() of a non-bridge = %v, want %v", err, errNotBridge)
	}
	if len(ip.changes) != 0 {
		t.Errorf("changes = %q, want none", ip.changes)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
}

var nsCounter atomic.Int32

// testConfig returns a configuration in a namespace of the test's own, and
// removes whatever is left of that namespace when the test ends.
func testConfig(t *testing.T) Config {
	t.Helper()
	cfg := Config{
		Namespace:  fmt.Sprintf("orrtest-%d-%d", os.Getpid(), nsCounter.Add(1)),
		Bridge:     "orrbr0",
		Gateway:    netip.MustParsePrefix("10.231.0.1/24"),
		MetadataIP: netip.MustParseAddr("169.254.169.254"),
	}
	t.Cleanup(func() {
		if err := Cleanup(context.Background(), cfg.Namespace, cfg.Bridge, "orrtap"); err != nil {
			t.Errorf("clean up test namespace: %v", err)
		}
	})
	return cfg
}

func namespaceLinks(t *testing.T, ns string) map[string]link {
	t.Helper()
	ls, err := ipTool{cmd: execIP{}}.links(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]link{}
	for _, l := range ls {
		m[l.Name] = l
	}
	return m
}

func namespaceExists(t *testing.T, ns string) bool {
	t.Helper()
	ok, err := ipTool{cmd: execIP{}}.namespaceExists(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestNetwork(t *testing.T) {
	requireRoot(t)
	ctx := t.Context()
	cfg := testConfig(t)
	n, err := Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Destroy is idempotent; this one matters only if the test fails early.
	t.Cleanup(func() { n.Destroy(context.Background()) })
	for _, tap := range []string{"orrtap0", "orrtap1"} {
		if err := n.AddTap(ctx, tap); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.AddTap(ctx, "orrtap0"); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "link del orrtap0'") {
		t.Errorf("AddTap() of an existing tap = %v, want %v naming 'ip ... link del orrtap0'", err, ErrExists)
	}
	if got, want := n.Taps(), []string{"orrtap0", "orrtap1"}; !slices.Equal(got, want) {
		t.Errorf("Taps() = %q, want %q", got, want)
	}

	links := namespaceLinks(t, cfg.Namespace)
	if !links[cfg.Bridge].isBridge() {
		t.Errorf("no bridge %q in the namespace: %+v", cfg.Bridge, links)
	}
	for _, tap := range []string{"orrtap0", "orrtap1"} {
		l, ok := links[tap]
		if !ok || !l.isTap() || l.Master != cfg.Bridge {
			t.Errorf("tap %q = %+v (present %v), want a tap with master %q", tap, l, ok, cfg.Bridge)
		}
	}
	checkBridgeAddresses(t, cfg)
	// The bridge lives in the namespace only.
	if _, err := net.InterfaceByName(cfg.Bridge); err == nil {
		t.Errorf("bridge %q is visible in the host namespace", cfg.Bridge)
	}
	if got, want := n.ExecPrefix(), []string{"ip", "netns", "exec", cfg.Namespace}; !slices.Equal(got, want) {
		t.Errorf("ExecPrefix() = %q, want %q", got, want)
	}

	for _, addr := range []string{"10.231.0.1:0", "169.254.169.254:0", "127.0.0.1:0"} {
		t.Run("dial "+addr, func(t *testing.T) { testDialInside(t, n, addr) })
	}
	// Do must not leave the caller's thread in the namespace.
	if err := n.Do(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(cfg.Bridge); err == nil {
		t.Error("after Do, the caller sees the namespace's bridge")
	}

	if _, err := Create(ctx, cfg); !errors.Is(err, ErrExists) {
		t.Errorf("second Create() = %v, want %v", err, ErrExists)
	}

	if err := n.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if namespaceExists(t, cfg.Namespace) {
		t.Errorf("namespace %q still exists after Destroy", cfg.Namespace)
	}
	if err := n.Destroy(ctx); err != nil {
		t.Errorf("second Destroy() = %v", err)
	}
	if err := n.Do(func() error { return nil }); err == nil {
		t.Error("Do() after Destroy succeeded")
	}
}

// checkBridgeAddresses checks that the bridge carries the gateway and
// the metadata address.
func checkBridgeAddresses(t *testing.T, cfg Config) {
	t.Helper()
	out, err := exec.Command("ip", "-n", cfg.Namespace, "-j", "addr", "show", "dev", cfg.Bridge).Output()
	if err != nil {
		t.Fatal(err)
	}
	var addrs []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &addrs); err != nil || len(addrs) != 1 {
		t.Fatalf("parse ip addr output %q: %v", out, err)
	}
	var got []string
	for _, a := range addrs[0].AddrInfo {
		got = append(got, fmt.Sprintf("%s/%d", a.Local, a.PrefixLen))
	}
	for _, want := range []string{"10.231.0.1/24", "169.254.169.254/32"} {
		if !slices.Contains(got, want) {
			t.Errorf("bridge addresses %q lack %s", got, want)
		}
	}
}

// testDialInside listens inside the namespace, accepts outside Do and
// dials inside Do: sockets must stay in the namespace they were made in.
func testDialInside(t *testing.T, n *Network, addr string) {
	var ln net.Listener
	err := n.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err
			return
		}
		defer c.Close()
		_, err = io.WriteString(c, "hello")
		accepted <- err
	}()
	var got []byte
	err = n.Do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.DialContext(t.Context(), "tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		got, err = io.ReadAll(c)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if string(got) != "hello" {
		t.Errorf("read %q, want %q", got, "hello")
	}
}

func TestCleanup(t *testing.T) {
	requireRoot(t)
	ctx := t.Context()
	cfg := testConfig(t)
	n, err := Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Destroy only closes the namespace file here: Cleanup did the work.
	defer n.Destroy(context.Background())
	for _, tap := range []string{"orrtap0", "orrtap1"} {
		if err := n.AddTap(ctx, tap); err != nil {
			t.Fatal(err)
		}
	}
	// As if the run had crashed: remove everything by name alone.
	if err := Cleanup(ctx, cfg.Namespace, cfg.Bridge, "orrtap"); err != nil {
		t.Fatal(err)
	}
	if namespaceExists(t, cfg.Namespace) {
		t.Errorf("namespace %q still exists after Cleanup", cfg.Namespace)
	}
	if err := Cleanup(ctx, cfg.Namespace, cfg.Bridge, "orrtap"); err != nil {
		t.Errorf("second Cleanup() = %v", err)
	}
	// The names are free again.
	n2, err := Create(ctx, cfg)
	if err != nil {
		t.Fatalf("Create() after Cleanup = %v", err)
	}
	if err := n2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}
