package packetcapture

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The control of the e2e's check that pod traffic crosses the cloud's
// network encrypted: over a real kernel VXLAN link between two network
// namespaces, as flannel's vxlan backend sends pod traffic, the capture
// on the underlying link sees a marker sent across in clear text, and
// counts the VXLAN datagrams; a marker nobody sent it never sees.
func TestCaptureSeesAMarkerOverVXLAN(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and a packet socket")
	}
	a, b := netns(t), netns(t)
	ip(t, "link", "add", "pc-a", "netns", a, "type", "veth", "peer", "name", "pc-b", "netns", b)
	for _, side := range []struct{ ns, dev, under, remote, over string }{
		{a, "pc-a", "192.0.2.1/24", "192.0.2.2", "198.51.100.1/24"},
		{b, "pc-b", "192.0.2.2/24", "192.0.2.1", "198.51.100.2/24"},
	} {
		ip(t, "-n", side.ns, "addr", "add", side.under, "dev", side.dev)
		ip(t, "-n", side.ns, "link", "set", side.dev, "up")
		ip(t, "-n", side.ns, "link", "add", "pc-vx", "type", "vxlan", "id", "42", "remote", side.remote, "dstport", "4789", "dev", side.dev)
		ip(t, "-n", side.ns, "addr", "add", side.over, "dev", "pc-vx")
		ip(t, "-n", side.ns, "link", "set", "pc-vx", "up")
	}
	sent, unsent := marker(t), marker(t)
	c, err := Start("/run/netns/"+b, "pc-b", sent, unsent)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	every, err := Start("/run/netns/"+b, "", sent)
	if err != nil {
		t.Fatal(err)
	}
	defer every.Stop()
	err = InNamespace("/run/netns/"+a, func() error {
		// Unconnected: nothing listens, and the ICMP answers must not
		// end the sending.
		conn, err := net.ListenPacket("udp4", "198.51.100.1:0")
		if err != nil {
			return err
		}
		defer conn.Close()
		to := &net.UDPAddr{IP: net.IPv4(198, 51, 100, 2), Port: 9999}
		for range 5 {
			if _, err := conn.WriteTo(append([]byte("pod says: "), sent...), to); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send across the VXLAN link: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	stats, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("captured %d frames, %d bytes; UDP by port %v", stats.Frames, stats.Bytes, stats.UDP)
	if stats.Seen[string(sent)] == 0 || stats.UDP[4789] == 0 {
		t.Errorf("the marker sent over VXLAN: seen in %d frames, %d VXLAN datagrams; want both", stats.Seen[string(sent)], stats.UDP[4789])
	}
	if stats.Seen[string(unsent)] != 0 {
		t.Errorf("a marker nobody sent was seen in %d frames", stats.Seen[string(unsent)])
	}
	// Every interface of b: the veth, and the VXLAN device the marker
	// came out of in clear text.
	if stats, err := every.Stop(); err != nil || stats.Seen[string(sent)] < 2 || stats.UDP[4789] == 0 {
		t.Errorf("capturing every interface: %+v, %v; want the marker on both devices and the VXLAN datagrams", stats, err)
	}
}

func TestStartRefusesAMissingInterface(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a packet socket")
	}
	if _, err := Start("", "no-such-if0"); err == nil || !strings.Contains(err.Error(), "no-such-if0") {
		t.Fatalf("err = %v, want one naming the interface", err)
	}
	if _, err := Start("/run/netns/no-such-namespace", "lo"); err == nil {
		t.Fatal("a missing namespace was entered")
	}
}

func marker(t *testing.T) []byte {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return []byte("orrery-marker-" + hex.EncodeToString(b))
}

// netns makes a network namespace the test removes, and returns its name.
func netns(t *testing.T) string {
	t.Helper()
	name := "pcap-" + hex.EncodeToString(marker(t)[14:20])
	ip(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// udpPorts reads whatever crosses the link: it never reads past a
// frame, and finds the ports of a well-formed datagram.
func FuzzUDPPorts(f *testing.F) {
	frame := make([]byte, 14+20+8)
	frame[12], frame[13] = 0x08, 0x00
	frame[14], frame[14+9] = 0x45, 17
	frame[34], frame[35], frame[36], frame[37] = 0xca, 0x6c, 0x12, 0xb5
	if src, dst, ok := udpPorts(frame); !ok || src != 51820 || dst != 4789 {
		f.Fatalf("udpPorts = %d, %d, %v; want 51820, 4789", src, dst, ok)
	}
	f.Add(frame)
	f.Add(frame[:30])
	f.Fuzz(func(t *testing.T, b []byte) {
		src, dst, ok := udpPorts(b)
		if ok && len(b) < 14+28 {
			t.Fatalf("ports %d %d from a %d-byte frame", src, dst, len(b))
		}
	})
}
