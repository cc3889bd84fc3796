package cloud

import (
	"context"
	"fmt"
	"net"

	"github.com/orrery-dev/orrery/internal/cloud/console"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
)

// RunOnConsole runs command in the shell on the node's serial console, as
// an operator at the console would, and returns its output and exit
// status (see console.Run for how the command runs and what a timeout
// does). Only a debug image (make image DEBUG=1) has a shell there. ctx
// should carry a deadline; one console serves one caller at a time.
func (n *Node) RunOnConsole(ctx context.Context, command string) (string, int, error) {
	if n.vm == nil {
		return "", -1, fmt.Errorf("node %s: no VM of this process runs it", n.Name)
	}
	select {
	case <-n.vm.Exited():
		return "", -1, fmt.Errorf("node %s: %w", n.Name, vm.ErrExited)
	default:
	}
	// The socket is a path in the host's file system: it works from here
	// while QEMU runs in the cloud's network namespace.
	sock := n.vm.ConsoleSocket()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return "", -1, fmt.Errorf("node %s: connect to the serial console: %w", n.Name, err)
	}
	defer conn.Close()
	out, code, err := console.Run(ctx, conn, command)
	if err != nil {
		return out, code, fmt.Errorf("node %s: serial console %s: %w", n.Name, sock, err)
	}
	return out, code, nil
}
