// Command mkinitrd builds the node's initrd into a directory:
//
//	go run ./initrd/mkinitrd [-release 6.1.0-...-cloud-amd64] OUTDIR
//
// It prints progress and per-phase timings; initrd/build.sh wraps it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/orrery-dev/orrery/initrd/internal/initrdbuild"
)

func main() {
	release := flag.String("release", "", "kernel release whose modules to include (default: newest Debian cloud kernel in /boot)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: mkinitrd [-release R] OUTDIR\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if _, err := initrdbuild.Build(flag.Arg(0), initrdbuild.Options{Release: *release}); err != nil {
		fmt.Fprintf(os.Stderr, "mkinitrd: %v\n", err)
		os.Exit(1)
	}
}
