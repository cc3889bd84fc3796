package vm_test

import (
	"context"
	"io"
	"log"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/nodepackages"
)

// A node VM booting an image with UEFI, with a state disk and a vTPM that
// is provisioned before its first boot.
func ExampleStart() {
	ctx := context.Background()
	kernel, _ := nodepackages.Kernel()
	accel, why := vm.Probe(ctx, kernel.Path)
	log.Printf("accelerator %s: %s", accel, why)

	v, err := vm.Start(ctx, vm.Config{
		Name:         "node-0",
		Dir:          "/var/lib/orrery/mini/node-0",
		CPUs:         2,
		MemoryMiB:    2048,
		Accel:        accel,
		Image:        "/var/lib/orrery/image.raw",
		StateDiskMiB: 4096,
		ProvisionTPM: func(rw io.ReadWriter) error {
			return nil // e.g. platformca.CA.ProvisionAK
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("serial console: %s", v.SerialLog())
	if err := v.PowerDown(ctx, 30*time.Second); err != nil {
		log.Fatal(err)
	}
}
