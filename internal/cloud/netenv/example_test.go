package netenv_test

import (
	"context"
	"log"
	"net"
	"net/netip"
	"os/exec"

	"github.com/orrery-dev/orrery/internal/cloud/netenv"
)

// Example shows the life of a test network: a namespace with a bridge, a
// tap per VM, a server listening inside and QEMU started inside.
func Example() {
	ctx := context.Background()
	n, err := netenv.Create(ctx, netenv.Config{
		Namespace:  "orrery-e2e",
		Bridge:     "orrery0",
		Gateway:    netip.MustParsePrefix("10.42.0.1/16"),
		MetadataIP: netip.MustParseAddr("169.254.169.254"),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Destroy(ctx)
	if err := n.AddTap(ctx, "orrtap0"); err != nil {
		log.Fatal(err)
	}
	var ln net.Listener
	err = n.Do(func() error {
		ln, err = net.Listen("tcp", "169.254.169.254:80")
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	// Serve the metadata API on ln from any goroutine: the socket stays in
	// the namespace.

	args := append(n.ExecPrefix(), "qemu-system-x86_64",
		"-netdev", "tap,id=net0,ifname=orrtap0,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=net0,mac=52:54:00:00:00:10")
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	_ = cmd // start it, wait for it, ...
}
