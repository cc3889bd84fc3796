// Package packetcapture reads the frames that cross a network interface,
// of the host or of a named network namespace, so that a test can tell
// what an observer on that link (the hypervisor, on the local cloud's
// bridge) sees: whether a marker a pod sent crossed it in clear text, and
// how many UDP datagrams of a port (WireGuard's, VXLAN's) did.
//
// It opens an AF_PACKET socket, as tcpdump does, so it needs
// CAP_NET_RAW, and CAP_SYS_ADMIN to enter another namespace.
package packetcapture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Capture is a running capture.
type Capture struct {
	fd      int
	markers [][]byte
	done    chan struct{}

	stopOnce sync.Once
	mu       sync.Mutex
	stopped  bool
	stats    Stats
	err      error
}

// Stats is what a capture saw.
type Stats struct {
	// Frames and Bytes count every frame read.
	Frames, Bytes int
	// Seen counts the frames that held each marker, by marker.
	Seen map[string]int
	// UDP counts IPv4 UDP datagrams by port (source or destination).
	UDP map[uint16]int
}

// Start captures every frame crossing iface ("" for every interface) in
// the network namespace at netns (a path such as /run/netns/NAME, or ""
// for the caller's own), looking for markers in each. A bridge's own
// interface sees only what the host itself sends and receives, not what
// the bridge forwards between its ports: to see what crosses a bridge,
// capture its ports, or every interface (each forwarded frame is then
// seen twice, on the port it came in by and the one it left by).
func Start(netns, iface string, markers ...[]byte) (*Capture, error) {
	fd, err := openIn(netns, iface)
	if err != nil {
		return nil, err
	}
	// A read returns at least every 200 ms, so Stop is never kept
	// waiting by a quiet link.
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("packet capture: set a read timeout: %w", err)
	}
	c := &Capture{fd: fd, markers: markers, done: make(chan struct{}),
		stats: Stats{Seen: map[string]int{}, UDP: map[uint16]int{}}}
	go c.read()
	return c, nil
}

// openIn opens a packet socket bound to iface, from inside netns: a
// socket stays in the namespace it was made in.
func openIn(netns, iface string) (int, error) {
	fd := -1
	err := InNamespace(netns, func() error {
		// Index 0 is every interface of the namespace.
		ifi := &net.Interface{Name: "every interface"}
		if iface != "" {
			var err error
			if ifi, err = net.InterfaceByName(iface); err != nil {
				return fmt.Errorf("packet capture: interface %s: %w", iface, err)
			}
		}
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("packet capture: open a packet socket (needs CAP_NET_RAW): %w", err)
		}
		if err := unix.Bind(s, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(s)
			return fmt.Errorf("packet capture: bind to %s: %w", ifi.Name, err)
		}
		fd = s
		return nil
	})
	return fd, err
}

// InNamespace runs f on an OS thread inside the network namespace at
// netns ("" for the caller's own). Sockets f opens stay in that
// namespace after it returns.
func InNamespace(netns string, f func() error) error {
	if netns == "" {
		return f()
	}
	ch := make(chan error, 1)
	go func() {
		// A thread that cannot be put back in its namespace stays
		// locked, and so ends with this goroutine.
		runtime.LockOSThread()
		back, err := runIn(netns, f)
		if back {
			runtime.UnlockOSThread()
		}
		ch <- err
	}()
	return <-ch
}

func runIn(netns string, f func() error) (back bool, err error) {
	own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return true, err
	}
	defer own.Close()
	target, err := os.Open(netns)
	if err != nil {
		return true, fmt.Errorf("network namespace: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return true, fmt.Errorf("enter %s (needs CAP_SYS_ADMIN): %w", netns, err)
	}
	err = f()
	return unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil, err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (c *Capture) read() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		c.mu.Lock()
		stopped := c.stopped
		c.mu.Unlock()
		if stopped {
			return
		}
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			c.mu.Lock()
			c.err = fmt.Errorf("packet capture: read: %w", err)
			c.mu.Unlock()
			return
		}
		c.count(buf[:n])
	}
}

func (c *Capture) count(frame []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Frames++
	c.stats.Bytes += len(frame)
	for _, m := range c.markers {
		if bytes.Contains(frame, m) {
			c.stats.Seen[string(m)]++
		}
	}
	if src, dst, ok := udpPorts(frame); ok {
		c.stats.UDP[src]++
		if dst != src {
			c.stats.UDP[dst]++
		}
	}
}

// udpPorts reads the ports of an Ethernet frame holding an IPv4 UDP
// datagram.
func udpPorts(frame []byte) (src, dst uint16, ok bool) {
	const ethHeader = 14
	if len(frame) < ethHeader+20 || binary.BigEndian.Uint16(frame[12:14]) != unix.ETH_P_IP {
		return 0, 0, false
	}
	ip := frame[ethHeader:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || ip[9] != unix.IPPROTO_UDP || len(ip) < ihl+8 {
		return 0, 0, false
	}
	udp := ip[ihl:]
	return binary.BigEndian.Uint16(udp[0:2]), binary.BigEndian.Uint16(udp[2:4]), true
}

// Stats returns what the capture saw so far.
func (c *Capture) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Seen, s.UDP = map[string]int{}, map[uint16]int{}
	for k, v := range c.stats.Seen {
		s.Seen[k] = v
	}
	for k, v := range c.stats.UDP {
		s.UDP[k] = v
	}
	return s
}

// Stop ends the capture and returns what it saw, and the error that
// ended it early, if any.
func (c *Capture) Stop() (Stats, error) {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		c.stopped = true
		c.mu.Unlock()
		<-c.done
		unix.Close(c.fd)
	})
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	return c.Stats(), err
}
