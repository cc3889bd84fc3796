package console_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud/console"
)

// A debug node's serial console, as QEMU serves it on a Unix socket (see
// vm.VM.ConsoleSocket), asked whether bootstrapperd runs.
func ExampleRun() {
	conn, err := net.Dial("unix", "/var/lib/orrery/cloud/cp-0/serial.sock")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, code, err := console.Run(ctx, conn, "systemctl is-active bootstrapperd")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit status %d: %s", code, out)
}
