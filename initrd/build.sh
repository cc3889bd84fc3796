#!/usr/bin/env bash
# Builds the node's initrd: initrd/build.sh OUTDIR -> OUTDIR/initrd.cpio.zst
# (reproducible; see initrd/README.md). Needs Go, cryptsetup-bin and
# e2fsprogs (make deps installs them); the kernel's modules come from the
# kernel image/packages/packages.lock pins, which this fetches first. With
# TOOLS-ROOT (the image build passes its OS tree), the tools and their
# libraries come from that tree instead of this machine.
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
	echo "usage: $0 OUTDIR [TOOLS-ROOT]" >&2
	exit 2
fi
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin CGO_ENABLED=0
image/packages/fetch.sh >/dev/null
exec go run ./initrd/mkinitrd ${2:+-tools-root "$2"} "$1"
