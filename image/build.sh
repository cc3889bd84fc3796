#!/usr/bin/env bash
# build.sh OUTDIR: builds the node image and its predicted measurements.
# 'make image' runs it as 'image/build.sh build/image'; DEBUG=1 builds the
# debug variant into OUTDIR-debug instead (root autologin on ttyS0, other
# measurements). See image/README.md for the phases and the caches.
# TRUST=path/to/measurements.json makes the image's nodes accept the join
# services of that (older) image too, for a rollout that replaces it: its
# PCRs 4, 9 and 11 go on the kernel command line (orrery.trust_join_service,
# internal/joinconn), which is part of the UKI and so of the measurements.
set -euo pipefail
export LC_ALL=C

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly repo=$PWD

out=${1:?usage: image/build.sh OUTDIR}
variant=production
if [[ ${DEBUG:-0} == 1 ]]; then
	variant=debug
	out=${out%/}-debug
fi
readonly cache=$repo/build/cache/image
export PATH=$PATH:/usr/local/go/bin

started=$(date +%s.%N)
phase_start=$started
phase_name=
phase() {
	local now
	now=$(date +%s.%N)
	[[ -n $phase_name ]] && awk -v n="$phase_name" -v a="$phase_start" -v b="$now" 'BEGIN{printf "image: %-11s done in %5.1fs\n", n, b-a}'
	phase_name=$1 phase_start=$now
	[[ -n $1 ]] && printf 'image: %-11s %s\n' "$1" "$2"
	return 0
}
die() {
	printf 'image: error: %s\n' "$*" >&2
	exit 1
}

# --- preflight --------------------------------------------------------------
[[ $(id -u) == 0 ]] || die "building the image needs root (mkosi, file ownership in the root file system): run 'sudo make image'"
missing=()
need() { command -v "$1" >/dev/null || missing+=("$1 (Debian package $2)"); }
need mkosi mkosi
need mkfs.erofs erofs-utils
need veritysetup cryptsetup-bin
need mkfs.fat dosfstools
need mcopy mtools
need qemu-img qemu-utils
need cpio cpio
need jq jq
need busybox busybox-static
need curl curl
need depmod kmod
need go "Go 1.26, see hack/deps.sh"
if ((${#missing[@]})); then
	printf 'image: missing: %s\n' "${missing[@]}" >&2
	die "run 'make deps' to install what is missing"
fi
# The kernel, its modules and systemd-stub: the Debian packages
# image/packages/packages.lock pins, fetched and checked into
# build/packages; nothing of the build host's /boot or /lib/modules.
. image/packages/packages.sh
fetched=$(image/packages/fetch.sh)
kernel_dir=$(awk '$1 == "kernel" {print $2}' <<<"$fetched")
stub=$(awk '$1 == "stub" {print $2}' <<<"$fetched")/usr/lib/systemd/boot/efi/linuxx64.efi.stub
[[ -f $stub ]] || die "the pinned systemd-boot-efi holds no $stub"
kernel=$(ls "$kernel_dir"/boot/vmlinuz-* 2>/dev/null | head -n1 || true)
[[ -n $kernel ]] || die "the pinned kernel package holds no boot/vmlinuz-*"
kver=${kernel##*/vmlinuz-}
# A node must be able to get its SEV-SNP report or TDX quote from its
# kernel: an image without the guest drivers would boot on a confidential
# VM and never attest.
for opt in CONFIG_SEV_GUEST CONFIG_TDX_GUEST_DRIVER CONFIG_INTEL_TDX_GUEST CONFIG_TSM_REPORTS; do
	grep -qs "^$opt=[ym]" "$kernel_dir/boot/config-$kver" ||
		die "kernel $kver lacks $opt (a confidential guest's drivers): pin a 6.12 cloud kernel ('make pin-packages')"
done
packages_lock=$(packages_digest)
mkdir -p "$cache" "$out"
# Everything that ends up in the image is dated at the commit's time.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
export SOURCE_DATE_EPOCH
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# The join and key services' image; the cluster services' manifests name it.
JOINSERVICE_REF=localhost/orrery/joinservice:v1
printf 'image: %s variant into %s (kernel %s, commit %s)\n' "$variant" "$out" "$kver" "$commit"

# --- the OS tree (mkosi), cached by the hash of mkosi.conf and the lock ----
key=$( (cat mkosi.conf; mkosi --version; packages_lines tree) | sha256sum | cut -c1-16)
tree=$cache/tree-$key
if [[ -f $tree.done ]]; then
	phase tree "cached ($tree)"
else
	phase tree "mkosi builds the Debian tree (about a minute; cached by the hash of mkosi.conf)"
	rm -rf "$tree" "$tree.tmp" "$tree.manifest"
	# mkosi's own package cache makes a changed mkosi.conf cheaper.
	mkdir -p "$cache/mkosi-packages"
	mkosi --force --cache="$cache/mkosi-packages" --output="$tree.tmp" build >"$cache/mkosi.log" 2>&1 ||
		die "mkosi failed; its log: $cache/mkosi.log"
	mv "$tree.tmp" "$tree"
	mv "$tree.tmp.manifest" "$tree.manifest"
	# mkosi installs what the archive serves today; the image takes only
	# what the lock pins. A refused tree is not cached; its manifest stays
	# for 'make pin-packages'.
	packages_check_tree "$tree.manifest" "$cache/mkosi-packages/debian~bookworm"
	# Drop trees of older mkosi.conf versions.
	for old in "$cache"/tree-*.done; do
		[[ $old == "$tree.done" ]] || rm -rf "${old%.done}" "$old" "${old%.done}.manifest"
	done
	touch "$tree.done"
fi

# --- initrd -----------------------------------------------------------------
phase initrd "initrd/build.sh build/initrd, with the tree's tools"
# The initrd's cryptsetup, veritysetup, dmsetup and mke2fs, and their
# libraries, come from the pinned tree, not from this machine.
initrd/build.sh build/initrd "$tree"
initrd=
for f in build/initrd/initrd.cpio.zst build/initrd/initrd.cpio.gz; do
	[[ -f $f ]] && initrd=$f && break
done
[[ -n $initrd ]] || die "initrd/build.sh wrote no build/initrd/initrd.cpio.{zst,gz}"
initrd_kind=orrery

# --- Orrery's programs ------------------------------------------------------
phase programs "build bootstrapperd, orrery-inspectd and nodeimage"
mkdir -p build/bin
CGO_ENABLED=0 go build -trimpath -o "$cache/nodeimage" ./image/nodeimage
CGO_ENABLED=0 go build -trimpath -o build/bin/orrery-inspectd ./inspectd
have_bootstrapperd=no
if [[ -n $(go list -f '{{if eq .Name "main"}}main{{end}}' ./bootstrapperd 2>/dev/null) ]]; then
	CGO_ENABLED=0 go build -trimpath -o build/bin/bootstrapperd ./bootstrapperd
	have_bootstrapperd=yes
else
	printf 'image: bootstrapperd/ has no main package yet: the image has no bootstrapperd\n'
fi

# --- the root file system ---------------------------------------------------
phase rootfs "stage the tree with Orrery's files ($variant)"
root=$cache/rootfs-$variant
rm -rf "$root"
# Package-manager state, docs, man pages and locales: not needed at
# runtime. /var stays empty (the initrd mounts the state disk there), so
# dpkg's and apt's state go with it; manifest.json lists the packages.
mkdir -p "$root/var"
chmod 0755 "$root" "$root/var"
find "$tree" -mindepth 1 -maxdepth 1 ! -name var -exec cp -a {} "$root/" \;
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,linda,bug,doc-base,menu} "$root"/boot/*
mkdir -p "$root/usr/share/doc" "$root/usr/share/man"
# The kernel's modules, for the one kernel in the UKI.
mkdir -p "$root/usr/lib/modules"
cp -a "$kernel_dir/lib/modules/$kver" "$root/usr/lib/modules/"
# kubeadm's preflight reads the kernel's configuration from /boot.
mkdir -p "$root/boot"
cp "$kernel_dir/boot/config-$kver" "$root/boot/"
# Defaults of the image: /etc/hosts, /etc/fstab.
cp -r --no-preserve=ownership image/rootfs/. "$root/"

# units/ (see units/README.md): system/* -> /usr/lib/systemd/system/,
# etc/** -> /etc/, enable.list names the units to enable.
enable=()
if [[ -d units ]]; then
	for f in units/*; do
		case ${f#units/} in
		README.md | enable.list) ;;
		system) cp -r --no-preserve=ownership units/system/. "$root/usr/lib/systemd/system/" ;;
		etc) cp -r --no-preserve=ownership units/etc/. "$root/etc/" ;;
		*) die "$f: image/build.sh does not know where it goes (units/README.md lists what units/ may hold)" ;;
		esac
	done
	if [[ -f units/enable.list ]]; then
		while read -r u _; do
			[[ -z $u || $u == \#* ]] || enable+=("$u")
		done <units/enable.list
	else
		# Without a list: every unit with an [Install] section.
		for f in units/system/*; do
			[[ -f $f ]] && grep -q '^\[Install\]' "$f" && enable+=("${f##*/}")
		done
	fi
fi
enable+=(systemd-networkd.service systemd-resolved.service)
# The groups units/etc/sysusers.d asks for (tss, for the TPM), in the
# image's /etc/group: /etc is the image's at every boot.
systemd-sysusers --root="$root" >"$cache/sysusers.log" 2>&1 ||
	die "systemd-sysusers failed: $(tail -3 "$cache/sysusers.log")"
systemctl --root="$root" enable "${enable[@]}" >"$cache/systemctl.log" 2>&1 ||
	die "systemctl enable ${enable[*]} in the image failed: check units/enable.list ($(tail -n1 "$cache/systemctl.log"))"
# systemd-pcrphase would extend PCR 11 with "sysinit" and "ready" while
# bootstrapperd may already attest: PCR 11 would depend on timing. The
# initrd measures Orrery's phases instead. No apt, so no apt timers. The
# root is a read-only, verity-checked erofs: nothing for fsck (which
# delayed every unit by 1.1 s under TCG) and no LVM snapshots for e2scrub.
mask=(systemd-pcrphase.service systemd-pcrphase-sysinit.service systemd-pcrphase-initrd.service
	apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer getty@tty1.service
	systemd-fsck-root.service e2scrub_reap.service e2scrub_all.timer)
if [[ $variant == debug ]]; then
	# Root on the serial console without a password.
	mkdir -p "$root/usr/lib/systemd/system/serial-getty@ttyS0.service.d"
	cat >"$root/usr/lib/systemd/system/serial-getty@ttyS0.service.d/10-orrery-debug-autologin.conf" <<-'EOF'
		# Debug image only: root shell on the serial console.
		[Service]
		ExecStart=
		ExecStart=-/sbin/agetty -o '-p -f -- \\u' --noclear --autologin root --keep-baud 115200,57600,38400,9600 - $TERM
	EOF
else
	# No login on a production node; and a getty's vhangup() would silence
	# what bootstrapperd writes to the console.
	mask+=(serial-getty@ttyS0.service)
fi
systemctl --root="$root" mask "${mask[@]}" >/dev/null 2>&1 || die "systemctl mask failed"

if [[ $have_bootstrapperd == yes ]]; then
	install -m 0755 build/bin/bootstrapperd "$root/usr/bin/bootstrapperd"
fi
install -m 0755 build/bin/orrery-inspectd "$root/usr/bin/orrery-inspectd"
# bake_image ARCHIVE DIR: the archive's OCI image layout in DIR, and its one
# layer unpacked in DIR/rootfs. At boot, orrery-images links both into
# containerd in place (image/components/containerd/cmd/orrery-images): the
# unpacking and hashing that importing the archives cost every boot (two to
# three minutes under TCG) happen here, once.
bake_image() {
	local archive=$1 dir=$2 manifest layer
	rm -rf "$dir" && mkdir -p "$dir/rootfs"
	tar -xf "$archive" -C "$dir" --no-same-owner index.json oci-layout blobs
	manifest=$(jq -er '.manifests | if length == 1 then .[0].digest | ltrimstr("sha256:") else error("want one manifest") end' "$dir/index.json") ||
		die "$archive: not an OCI layout of one image"
	layer=$(jq -er '.layers | if length == 1 then .[0].digest | ltrimstr("sha256:") else error("want one layer") end' "$dir/blobs/sha256/$manifest") ||
		die "$archive: orrery-images links single-layer images only"
	tar -xzf "$dir/blobs/sha256/$layer" -C "$dir/rootfs" --numeric-owner --same-owner --same-permissions ||
		die "$archive: cannot unpack its layer"
}

# build/components (image/components/build.sh) counts once its manifest.json
# exists: it is written last.
have_components=no
if [[ -f build/components/manifest.json ]]; then
	have_components=yes
	# Every binary and image of every Kubernetes release, where the
	# releases' manifests say (a binary or image two releases share is
	# installed once, to the same place); orrery-images (not in the
	# manifests) beside containerd.
	while read -r path install; do
		install -D -m 0755 "build/components/$path" "$root$install"
	done < <(jq -r '[.[].binaries[] | "\(.path) \(.installPath)"] | unique | .[]' build/components/manifest.json)
	install -m 0755 build/components/bin/orrery-images "$root/usr/bin/orrery-images"
	while read -r path install; do
		bake_image "build/components/$path" "$root$install"
	done < <(jq -r '[.[].images[] | "\(.path) \(.installPath)"] | unique | .[]' build/components/manifest.json)
	# kubeadm, kubelet and kubectl of the release the node's cluster runs:
	# links through /run, which bootstrapperd points at one release's
	# folder (bootstrapperd/kubernetesrelease.go) before kubelet or
	# kubeadm runs. Until then they lead nowhere.
	for c in kubeadm kubelet kubectl; do
		ln -sf /run/orrery/kubernetes/$c "$root/usr/bin/$c"
	done
	# Orrery's own cluster services, as an image beside the upstream ones:
	# the join service and the key service (one binary, two containers).
	if [[ -x build/components/.work/containerimage && -n $(go list -f '{{if eq .Name "main"}}main{{end}}' ./joinservice 2>/dev/null) ]]; then
		CGO_ENABLED=0 go build -trimpath -o "$cache/joinservice" ./joinservice
		build/components/.work/containerimage -ref "$JOINSERVICE_REF" -out "$cache/joinservice.tar" \
			-created "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)" \
			-add "$cache/joinservice:/joinservice" -entrypoint '["/joinservice"]' >"$cache/joinservice-image.json"
		bake_image "$cache/joinservice.tar" "$root/usr/share/orrery/images/joinservice"
		printf 'image: join service image %s\n' "$JOINSERVICE_REF"
	fi
else
	printf 'image: no build/components/manifest.json (make components): the image has no Kubernetes components\n'
fi

# os-release of the image, also the UKI's .osrel.
version=$(awk -F= '$1=="VERSION_ID"{gsub(/"/,"",$2); print $2}' "$tree/usr/lib/os-release")
{
	printf 'NAME="Orrery"\nID=orrery\nID_LIKE=debian\nPRETTY_NAME="Orrery node (Debian %s)"\n' "$version"
	printf 'VERSION_ID=%s\nIMAGE_ID=orrery-node\nIMAGE_VERSION=%s\nVARIANT_ID=%s\n' "$version" "$commit" "$variant"
	printf 'HOME_URL="https://github.com/orrery-dev/orrery"\n'
	# The digest of image/packages/packages.lock: in the UKI's .osrel, so
	# in PCR 11's prediction, it ties the measurements to the packages.
	printf 'ORRERY_PACKAGES_LOCK=sha256:%s\n' "$packages_lock"
} >"$cache/os-release"
install -m 0644 "$cache/os-release" "$root/usr/lib/os-release"
ln -sf ../usr/lib/os-release "$root/etc/os-release"
# /sbin/init as a relative link, so that it resolves inside the mounted root
# too (the initrd checks it before switch_root).
[[ $(readlink "$root/usr/sbin/init") == /lib/systemd/systemd ]] && ln -sfn ../lib/systemd/systemd "$root/usr/sbin/init"
# An empty machine ID: the initrd writes the node's own, kept on its state
# disk, into /etc's tmpfs layer at every boot, so systemd finds one and
# there are no "first boot" semantics. With
# "uninitialized", the first boot also ran a preset of every unit: 7.4 s
# under TCG for nothing, since units/enable.list already decided what runs
# (and it failed on a masked unit anyway).
: >"$root/etc/machine-id"
[[ -z $(find "$root/var" -mindepth 1 -print -quit) ]] || die "/var is not empty in the image"

# --- erofs + dm-verity ------------------------------------------------------
phase erofs "mkfs.erofs (lz4hc) and veritysetup format"
rm -f "$cache/root.erofs" "$cache/root.verity"
# Every file takes the commit's time: erofs-utils 1.5 keeps each file's
# mtime in its (extended) inode whatever -T says, and the staged tree's
# mtimes are those of this build's copies, so two builds of one commit
# would differ in every inode.
find "$root" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
mkfs.erofs --quiet -zlz4hc -T "$SOURCE_DATE_EPOCH" -U 6f727265-7279-4000-8000-726f6f746673 \
	"$cache/root.erofs" "$root"
# Salt and UUID follow from the file system, so the hash tree is
# reproducible.
fs_sum=$(sha256sum "$cache/root.erofs" | cut -d' ' -f1)
verity_uuid=$(printf '%s-%s-4%s-8%s-%s' "${fs_sum:0:8}" "${fs_sum:8:4}" "${fs_sum:13:3}" "${fs_sum:17:3}" "${fs_sum:20:12}")
veritysetup format --hash=sha256 --data-block-size=4096 --hash-block-size=4096 \
	--salt="$fs_sum" --uuid="$verity_uuid" "$cache/root.erofs" "$cache/root.verity" >"$cache/verity.txt"
roothash=$(awk '/^Root hash:/{print $3}' "$cache/verity.txt")
[[ $roothash =~ ^[0-9a-f]{64}$ ]] || die "veritysetup printed no root hash: $(cat "$cache/verity.txt")"

# --- UKI, ESP, disk ---------------------------------------------------------
phase uki "UKI: systemd-stub + kernel + initrd + command line + os-release"
# tsc=reliable: without it the kernel never uses the TSC in a VM whose
# vCPUs report a non-Intel vendor without an invariant TSC (QEMU's TCG
# "max" CPU is "AMD QEMU TCG CPU") and falls back to the HPET, so every
# clock read, of which Go programs make many, becomes an emulated MMIO
# access. Cloud VMs have a hypervisor-provided stable TSC anyway; time is
# not part of Orrery's trust model (the TSC is the hypervisor's either way).
cmdline="console=ttyS0 tsc=reliable orrery.roothash=$roothash orrery.onfailure=poweroff"
[[ $variant == debug ]] && cmdline+=" orrery.debug=1"
if [[ -n ${TRUST:-} ]]; then
	trust=$(jq -er '[.["4"], .["9"], .["11"]] | map(.expected | select(test("^[0-9a-f]{64}$"))) | if length == 3 then join(",") else error("want PCRs 4, 9, 11") end' "$TRUST") ||
		die "TRUST=$TRUST: not a measurements.json with SHA-256 values of PCRs 4, 9 and 11"
	cmdline+=" orrery.trust_join_service=$trust"
fi
# Two flavours of the same root (nodeattest.FlavourParam): the local
# cloud's takes its simulated SEV-SNP, the cloud one never does. The
# flavour is on the UKI's command line, so their measurements differ and
# an owner's policy for one never admits the other.
flavours=(local cloud)
declare -A flavour_dir=([local]="$cache" [cloud]="$cache/cloud")
declare -A flavour_args=([local]=" orrery.flavour=local" [cloud]="")
declare -A flavour_disk_args=([local]="" [cloud]="-size-multiple-gib 1") # GCE imports whole GiB only
mkdir -p "$cache/cloud"
for f in "${flavours[@]}"; do
	d=${flavour_dir[$f]}
	printf '%s' "$cmdline${flavour_args[$f]}" >"$d/cmdline"
	"$cache/nodeimage" uki -stub "$stub" -kernel "$kernel" -initrd "$initrd" \
		-cmdline "$d/cmdline" -osrel "$cache/os-release" -out "$d/uki.efi"
done

phase disk "ESP (FAT32), GPT disk; qcow2 (local flavour), tar.gz (cloud flavour)"
for f in "${flavours[@]}"; do
	d=${flavour_dir[$f]}
	uki_mib=$(($(stat -c %s "$d/uki.efi") / 1048576 + 1))
	esp_mib=$((uki_mib + uki_mib / 4 + 8))
	((esp_mib >= 40)) || esp_mib=40 # FAT32 needs at least 65525 clusters
	rm -f "$d/esp.img"
	mkfs.fat -C -F 32 -S 512 -s 1 -n ESP -i 4f525259 --invariant "$d/esp.img" $((esp_mib * 1024)) >/dev/null
	touch -d "@$SOURCE_DATE_EPOCH" "$d/uki.efi"
	mmd -i "$d/esp.img" ::EFI ::EFI/BOOT
	mcopy -m -i "$d/esp.img" "$d/uki.efi" ::EFI/BOOT/BOOTX64.EFI
	"$cache/nodeimage" disk -esp "$d/esp.img" -root "$cache/root.erofs" -verity "$cache/root.verity" \
		-roothash "$roothash" ${flavour_disk_args[$f]} -out "$d/disk.raw"
done
qemu-img convert -f raw -O qcow2 "$cache/disk.raw" "$cache/disk.qcow2"
# What GCE imports (docs/confidential-clouds.md): disk.raw alone in a
# sparse GNU tar, gzip-compressed. Reproducible: fixed owner and time.
tar --format=oldgnu --sparse --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
	-cf - -C "$cache/cloud" disk.raw | gzip -n -1 >"$cache/cloud/disk.tar.gz"

# --- measurements and outputs -------------------------------------------------
phase measure "predict PCRs 4, 5, 9, 11; manifest"
# The SEV-SNP variant's launch measurement is that of the firmware the
# local cloud boots (internal/cloud/vm.DefaultFirmware); a cloud's
# firmware is its own (docs/confidential-clouds.md).
"$cache/nodeimage" measure -uki "$cache/uki.efi" -disk "$cache/disk.raw" -firmware image/firmware-pcrs.json \
	-out "$cache/measurements.json" -events "$cache/measurements.log" \
	-sev-snp-firmware /usr/share/OVMF/OVMF_CODE_4M.fd -sev-snp-out "$cache/measurements-sev-snp.json"
"$cache/nodeimage" measure -uki "$cache/cloud/uki.efi" -disk "$cache/cloud/disk.raw" -firmware image/firmware-pcrs.json \
	-out "$cache/cloud/measurements.json" -events "$cache/cloud/measurements.log"
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
for f in uki.efi disk.raw disk.qcow2 cmdline os-release measurements.json measurements-sev-snp.json measurements.log; do
	mv "$cache/$f" "$out.tmp/$f"
done
mkdir "$out.tmp/cloud"
for f in uki.efi disk.raw disk.tar.gz cmdline measurements.json measurements.log; do
	mv "$cache/cloud/$f" "$out.tmp/cloud/$f"
done
cp "$kernel" "$out.tmp/vmlinuz"
cp "$initrd" "$out.tmp/initrd"
components_manifest=()
[[ -f build/components/manifest.json ]] && components_manifest=(-components build/components/manifest.json)
"$cache/nodeimage" manifest -dir "$out.tmp" -packages "$tree.manifest" "${components_manifest[@]}" \
	-info "variant=$variant" -info "commit=$commit" -info "kernel=$kver" -info "roothash=$roothash" \
	-info "initrd=$initrd_kind" -info "bootstrapperd=$have_bootstrapperd" -info "components=$have_components" \
	-info "systemd-stub=$(packages_lines stub | awk '{print $3}')" \
	-info "kernel-package=$(packages_lines kernel | awk '{print $2 " " $3}')" \
	-info "packages-lock=sha256:$packages_lock" \
	-out "$out.tmp/manifest.json"
rm -rf "$out"
mv "$out.tmp" "$out"
phase "" ""
printf 'image: done in %.0fs: %s, local cloud flavour (disk %s MiB, root %s MiB, UKI %s MiB, initrd: %s); cloud flavour in %s/cloud\n' \
	"$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$out" \
	$(($(stat -c %s "$out/disk.raw") / 1048576)) $(($(stat -c %s "$cache/root.erofs") / 1048576)) \
	$(($(stat -c %s "$out/uki.efi") / 1048576)) "$initrd_kind" "$out"
