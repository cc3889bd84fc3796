// Command mkinitrd builds the node's initrd into a directory:
//
//	go run ./initrd/mkinitrd [-tools-root TREE] OUTDIR
//
// with the modules of the kernel image/packages/packages.lock pins
// ('make packages' fetches it), and the tools of the OS tree TREE (the
// image's) or else of the build host. It prints progress and per-phase
// timings; initrd/build.sh wraps it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/orrery-dev/orrery/initrd/internal/initrdbuild"
)

func main() {
	toolsRoot := flag.String("tools-root", "", "an OS tree whose cryptsetup, veritysetup, dmsetup and mke2fs (with their libraries) go in (default: the build host's)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: mkinitrd [-tools-root TREE] OUTDIR\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if _, err := initrdbuild.Build(flag.Arg(0), initrdbuild.Options{ToolsRoot: *toolsRoot}); err != nil {
		fmt.Fprintf(os.Stderr, "mkinitrd: %v\n", err)
		os.Exit(1)
	}
}
