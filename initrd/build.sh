#!/usr/bin/env bash
# Builds the node's initrd: initrd/build.sh OUTDIR -> OUTDIR/initrd.cpio.zst
# (reproducible; see initrd/README.md). Needs Go, cryptsetup-bin and
# e2fsprogs (make deps installs them); the kernel's modules come from the
# kernel image/packages/packages.lock pins, which this fetches first.
set -euo pipefail
if [[ $# -ne 1 ]]; then
	echo "usage: $0 OUTDIR" >&2
	exit 2
fi
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin CGO_ENABLED=0
image/packages/fetch.sh >/dev/null
exec go run ./initrd/mkinitrd "$1"
