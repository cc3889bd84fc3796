// Command mkinitrd builds the node's initrd into a directory:
//
//	go run ./initrd/mkinitrd OUTDIR
//
// with the modules of the kernel image/packages/packages.lock pins
// ('make packages' fetches it). It prints progress and per-phase timings;
// initrd/build.sh wraps it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/orrery-dev/orrery/initrd/internal/initrdbuild"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: mkinitrd OUTDIR\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if _, err := initrdbuild.Build(flag.Arg(0), initrdbuild.Options{}); err != nil {
		fmt.Fprintf(os.Stderr, "mkinitrd: %v\n", err)
		os.Exit(1)
	}
}
