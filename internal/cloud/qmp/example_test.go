package qmp_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud/qmp"
)

// A VM's QEMU started with
//
//	-chardev socket,id=qmp,server=on,wait=off,path=/run/vm0/qmp.sock -mon chardev=qmp,mode=control
//
// is asked for its state and then powered off.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := qmp.Dial(ctx, "/run/vm0/qmp.sock")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	status, running, err := c.QueryStatus(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("QEMU %s: %s (vCPUs running: %v)\n", c.Version(), status, running)

	// Commands without a helper go through Execute.
	var blocks []struct {
		Device string `json:"device"`
	}
	if err := c.Execute(ctx, "query-block", nil, &blocks); err != nil {
		log.Fatal(err)
	}

	if err := c.SystemPowerdown(ctx); err != nil {
		log.Fatal(err)
	}
	for ev := range c.Events() {
		if ev.Name == "SHUTDOWN" {
			break
		}
	}
}
