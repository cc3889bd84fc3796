#!/usr/bin/env bash
# fetch.sh: fetches and checks the pinned kernel and systemd-stub into
# build/packages ('make packages'), and prints where each is unpacked:
#   kernel DIR
#   stub DIR
# The kernel's modules get depmod's index there, as its package's
# postinst would make it on an installed system.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. image/packages/packages.sh

kernel=$(packages_fetch kernel)
[[ $(wc -l <<<"$kernel") == 1 && -n $kernel ]] || packages_die "$PACKAGES_LOCK must pin one kernel"
stub=$(packages_fetch stub)
[[ $(wc -l <<<"$stub") == 1 && -n $stub ]] || packages_die "$PACKAGES_LOCK must pin one systemd-boot-efi"
for d in "$kernel"/lib/modules/*/; do
	release=$(basename "$d")
	[[ -f $d/modules.dep ]] || depmod -b "$kernel" "$release" || packages_die "depmod of $release failed"
done
printf 'kernel %s\nstub %s\n' "$kernel" "$stub"
