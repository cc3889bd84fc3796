// Package netup brings up the node's network in the initrd, for a rejoin:
// DHCPv4 on every Ethernet interface through u-root's DHCP client, the
// first lease wins. Down undoes it before the switch to the OS, whose own
// network manager then starts from a clean link.
package netup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
)

// linkUpTimeout bounds the wait for a NIC's link to come up.
const linkUpTimeout = 10 * time.Second

// Lease is the configuration the node got.
type Lease struct {
	Interface string
	Addr      netip.Prefix
	link      netlink.Link
}

func (l Lease) String() string { return fmt.Sprintf("%s on %s", l.Addr, l.Interface) }

// Up asks for a DHCPv4 lease on every Ethernet interface and configures
// the first one that gets it (address, routes). timeout bounds one
// attempt; Up makes one.
func Up(ctx context.Context, timeout time.Duration) (Lease, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return Lease{}, fmt.Errorf("list network interfaces: %w", err)
	}
	var ifs []netlink.Link
	for _, l := range links {
		if l.Type() == "device" && l.Attrs().Flags&net.FlagLoopback == 0 && len(l.Attrs().HardwareAddr) == 6 {
			ifs = append(ifs, l)
		}
	}
	if len(ifs) == 0 {
		return Lease{}, errors.New("no Ethernet interface: attach a virtio NIC to the VM")
	}
	// The lease's Configure writes /etc/resolv.conf, in the initrd's own
	// (writable) root; nothing here resolves names.
	if err := os.MkdirAll("/etc", 0o755); err != nil {
		return Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var errs []string
	for r := range dhclient.SendRequests(ctx, ifs, true, false, dhclient.Config{Timeout: timeout / 3, Retries: 2, LogLevel: dhclient.LogInfo}, linkUpTimeout) {
		name := r.Interface.Attrs().Name
		if r.Err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", name, r.Err))
			continue
		}
		if err := r.Lease.Configure(); err != nil {
			errs = append(errs, fmt.Sprintf("%s: configure: %v", name, err))
			continue
		}
		var ipnet *net.IPNet
		if p4, isV4 := r.Lease.(*dhclient.Packet4); isV4 {
			ipnet = p4.Lease()
		}
		var addr netip.Addr
		ok := ipnet != nil
		if ok {
			addr, ok = netip.AddrFromSlice(ipnet.IP.To4())
		}
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: lease without an IPv4 address", name))
			continue
		}
		ones, _ := ipnet.Mask.Size()
		cancel() // the other interfaces' requests
		return Lease{Interface: name, Addr: netip.PrefixFrom(addr, ones), link: r.Interface}, nil
	}
	if len(errs) == 0 {
		errs = append(errs, "no interface came up")
	}
	return Lease{}, fmt.Errorf("DHCP: %s", strings.Join(errs, "; "))
}

// Down removes the lease's address and routes and sets the link down.
func (l Lease) Down() error {
	if l.link == nil {
		return nil
	}
	var errs []error
	if err := netlink.AddrDel(l.link, &netlink.Addr{IPNet: prefixToIPNet(l.Addr)}); err != nil {
		errs = append(errs, fmt.Errorf("remove %s from %s: %w", l.Addr, l.Interface, err))
	}
	if err := netlink.LinkSetDown(l.link); err != nil {
		errs = append(errs, fmt.Errorf("set %s down: %w", l.Interface, err))
	}
	return errors.Join(errs...)
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
