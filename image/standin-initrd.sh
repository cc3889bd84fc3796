#!/usr/bin/env bash
# standin-initrd.sh OUTDIR KERNEL_VERSION: a busybox initrd that stands in
# for initrd/ (the real, u-root based one) until that exists, so that the
# image boots. It honours the parts of the real initrd's contract that the
# measurements depend on (PCR 11 gets SHA-256("enter-initrd") and
# SHA-256("leave-initrd")), prints the PCRs and the firmware event log to
# the console for the boot test, mounts the partition named orrery-root
# read-only at /, a tmpfs at /var and a tmpfs overlay on /etc, and switches
# root. It does NOT check dm-verity and does not touch the state disk: it is
# for development only. Output: OUTDIR/initrd.cpio.gz (reproducible).
set -euo pipefail
out=$1 kver=$2
mods=/lib/modules/$kver
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,dev,proc,sys,run,newroot,lib/modules}
cp /usr/bin/busybox "$root/bin/busybox"
# Modules in load order (dependencies first).
order=(
	kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
	kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko
	kernel/drivers/virtio/virtio_pci.ko kernel/drivers/block/virtio_blk.ko
	kernel/lib/libcrc32c.ko kernel/fs/erofs/erofs.ko kernel/fs/overlayfs/overlay.ko
)
for m in "${order[@]}"; do
	cp "$mods/$m" "$root/lib/modules/"
	basename "$m" >>"$root/lib/modules/order"
done

# TPM2_PCR_Extend(PCR 11, SHA-256 bank, SHA-256(marker)) with an empty
# password session, as raw command bytes.
extend_cmd() {
	local digest
	digest=$(printf '%s' "$1" | sha256sum | cut -d' ' -f1)
	printf '\x80\x02\x00\x00\x00\x41\x00\x00\x01\x82\x00\x00\x00\x0b\x00\x00\x00\x09\x40\x00\x00\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x0b'
	printf "$(sed 's/../\\x&/g' <<<"$digest")"
}
extend_cmd enter-initrd >"$root/extend-enter-initrd"
extend_cmd leave-initrd >"$root/extend-leave-initrd"

cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
mount -t securityfs securityfs /sys/kernel/security
fail() { echo "standin-initrd: $*"; sleep 1; poweroff -f; }
for m in $(cat /lib/modules/order); do insmod "/lib/modules/$m" || fail "load $m"; done
pcrs() {
	for p in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
		echo "orrery-pcr $1 $p $(cat /sys/class/tpm/tpm0/pcr-sha256/$p)"
	done
}
pcrs before-initrd
echo "orrery-eventlog-begin"
base64 /sys/kernel/security/tpm0/binary_bios_measurements
echo "orrery-eventlog-end"
extend() {
	exec 3<>/dev/tpm0
	cat "/extend-$1" >&3
	rc=$(dd bs=4096 count=1 <&3 2>/dev/null | od -An -tx1 -j6 -N4 | tr -d ' \n')
	exec 3<&-
	[ "$rc" = 00000000 ] || fail "extend PCR 11 with $1: TPM response code $rc"
	echo "standin-initrd: measured $1 into PCR 11"
}
extend enter-initrd
dev=
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
	for u in /sys/class/block/*/uevent; do
		grep -qx PARTNAME=orrery-root "$u" && dev=$(sed -n 's/^DEVNAME=//p' "$u")
	done
	[ -n "$dev" ] && break
	sleep 0.2
done
[ -n "$dev" ] || fail "no partition named orrery-root"
mount -t erofs -o ro "/dev/$dev" /newroot || fail "mount /dev/$dev"
mount -t tmpfs -o mode=0755 tmpfs /newroot/var || fail "mount /var"
mkdir -p /newroot/var/.etc/upper /newroot/var/.etc/work
mount -t overlay overlay -o lowerdir=/newroot/etc,upperdir=/newroot/var/.etc/upper,workdir=/newroot/var/.etc/work /newroot/etc || fail "overlay /etc"
extend leave-initrd
pcrs after-initrd
umount /sys/kernel/security /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
INIT
chmod 0755 "$root/init" "$root/bin/busybox"
find "$root" -exec touch -h -d @0 {} +
mkdir -p "$out"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -9n >"$out/initrd.cpio.gz.tmp"
mv "$out/initrd.cpio.gz.tmp" "$out/initrd.cpio.gz"
