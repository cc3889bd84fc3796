// Command orrery-images makes the container images baked into the node's
// read-only root available to containerd without copying or unpacking them.
//
// Importing the images' OCI archives with `ctr images import` took two to
// three minutes of every node's boot under TCG, on the critical path of
// init and join: it hashes and decompresses about 180 MB and writes the
// unpacked layers to the encrypted state disk. The image build has already
// done that work, once, and the result sits on the dm-verity root, whose
// every block the kernel checks against the measured root hash. So at boot
// this program only tells containerd where things are:
//
//   - each blob of the image (manifest, config, layer) becomes a symlink in
//     containerd's content store to the blob on the root, then is committed
//     into the namespace as already present (containerd's "shared" content
//     path: no bytes are read or written);
//   - the layer's snapshot is created empty, its directory replaced by a
//     symlink to the layer unpacked at build time, and committed under the
//     layer's chain ID, the name containerd's unpacker looks for, so that
//     containers start from it as from any unpacked image;
//   - the image record names the manifest, pinned against kubelet's image
//     garbage collection, with the labels containerd's garbage collector
//     follows from image to manifest to config to snapshot.
//
// Both symlinks reach into containerd's on-disk layout (the content store's
// blobs/sha256/<hex> and the overlayfs snapshotter's snapshots/<id>/fs), not
// into an API. The test beside this file runs the real containerd to check
// that layout with each containerd version the image pins.
//
// Nothing of a baked image is taken from the state disk, which whoever is
// root on the node (a container escape) can write and which outlives a
// reboot. On every boot each blob's path in the content store must be
// exactly the symlink to the blob on the root (containerd checks only a
// blob's size), and the layer snapshot's directory exactly the symlink to
// the unpacked layer; anything else there (a directory, a file, a symlink
// elsewhere) is replaced, in place so that containers' snapshots based on
// the layer keep working, and a line says what was replaced and why. A
// layer snapshot the snapshotter's records give parents is removed and
// made again. The image record is re-asserted as well. On a boot where
// nothing changed that is a readlink per path and a throwaway view per
// layer, a few milliseconds per image. Images it made on an earlier boot
// that the current image no longer bakes (after an upgrade) are deleted,
// and containerd's garbage collector then drops their snapshots and blobs.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.ImagesDir, "images", "/usr/share/orrery/images", "directory of baked images: one OCI image layout per subdirectory, with the layer unpacked in rootfs/")
	flag.StringVar(&cfg.ContainerdRoot, "containerd-root", "/var/lib/containerd", "containerd's root directory (its config's root)")
	address := flag.String("address", "/run/containerd/containerd.sock", "containerd's socket")
	namespace := flag.String("namespace", "k8s.io", "containerd namespace (the CRI plugin's is k8s.io)")
	flag.StringVar(&cfg.Snapshotter, "snapshotter", "overlayfs", "snapshotter the CRI plugin uses (only overlayfs is supported)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags]\n\nMakes the images baked into the OS image available to containerd, in place.\n\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client, err := containerd.New(*address, containerd.WithTimeout(time.Minute))
	if err != nil {
		fmt.Fprintf(os.Stderr, "orrery-images: connect to containerd at %s: %v (is containerd.service running?)\n", *address, err)
		os.Exit(1)
	}
	defer client.Close()
	ctx = namespaces.WithNamespace(ctx, *namespace)
	if err := seed(ctx, client, cfg, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "orrery-images: %v\n", err)
		os.Exit(1)
	}
}
