#!/usr/bin/env bash
# deps.sh installs, idempotently, everything the build and the tests need on
# a Debian 12 machine: Debian packages (only those missing; apt-get update
# runs only if something is missing) and pinned Go tools into build/tools.
# It is what 'make deps' runs, and every other make target runs it first.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Debian packages, with what needs each.
readonly PACKAGES=(
	swtpm            # the TPM 2.0 every TPM test runs against
	swtpm-tools      # swtpm_setup, for vTPMs of VMs
	protobuf-compiler # protoc 3.21.12 for 'make proto' and its staleness check
	qemu-system-x86 qemu-utils ovmf # the local cloud's VMs (TCG when KVM does not work)
	iproute2         # namespaces, bridges and taps of the local cloud
	haproxy          # the local cloud's load balancer in front of its control planes
	cryptsetup-bin e2fsprogs # LUKS2 and ext4 for the state disk (initrd and its tests)
	dmsetup          # the initrd checks the opened state disk's table with it
	erofs-utils fdisk # the read-only root and its GPT in the initrd's VM test
	mkosi systemd-boot-efi dosfstools mtools cpio busybox-static # 'make image': OS tree, UKI stub, ESP
	gcc libc6-dev libseccomp-dev iptables nftables jq # 'make components': runc and flanneld (cgo), iptables/nft in images
	systemd          # systemd-measure: the PCR 11 prediction is checked against it
	systemd-journal-remote # writes real journal files for the inspect service's tests
	procps           # pgrep: the e2e suite checks that mini down leaves no VM process
	git ca-certificates make
)

# Go tools, pinned.
readonly STATICCHECK="honnef.co/go/tools/cmd/staticcheck@v0.8.2"
readonly GOLANGCI_LINT="github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0"

log() { printf 'deps: %s\n' "$*" >&2; }

# apt_install WHAT [APT-GET OPTION...] -- PACKAGE...: installs as root, or
# says how to and fails.
apt_install() {
	local what=$1 opts=()
	shift
	while [[ $1 != -- ]]; do
		opts+=("$1")
		shift
	done
	shift
	if [[ $(id -u) != 0 ]]; then
		log "missing $what: $*"
		log "run 'sudo make deps' once"
		exit 1
	fi
	log "installing $* ($what)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${opts[@]}" "$@" >/dev/null
}

missing=()
for p in "${PACKAGES[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if ((${#missing[@]})); then
	apt_install "Debian packages" -- "${missing[@]}"
fi

# From bookworm-backports, named as PACKAGE/bookworm-backports: apt takes
# only these, and those of their dependencies whose version bookworm lacks,
# from there. ('-t bookworm-backports' would also take every new
# dependency from there: on a machine without udev, the kernel's
# initramfs-tools pulled udev 254 and with it systemd and systemd-boot-efi
# 254, whose stub measures one more section into PCR 11.)
# - the node's kernel, which the image, the initrd and the local cloud's
#   tests take from /boot (the newest vmlinuz-*-cloud-amd64): Debian's
#   6.12 cloud kernel, the first for Debian 12 with the SEV-SNP and TDX
#   guest drivers and configfs-tsm (CONFIG_SEV_GUEST,
#   CONFIG_TDX_GUEST_DRIVER, CONFIG_TSM_REPORTS) and CONFIG_INTEL_TDX_GUEST;
#   bookworm's 6.1 has none of them.
# - QEMU 10, which the local cloud's VMs run in: under bookworm's QEMU 7.2,
#   TCG broke the 6.12 kernel at random (double faults, spurious debug
#   exceptions, garbage RFLAGS; 3 of 4 boots of the initrd's VM test died,
#   with one host thread per vCPU or one for all, with AVX off or on).
readonly BACKPORTS=/etc/apt/sources.list.d/orrery-bookworm-backports.list
backports=()
grep -qs '^CONFIG_SEV_GUEST=[ym]' /boot/config-*-cloud-amd64 || backports+=(linux-image-cloud-amd64)
qemu=$(qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p')
((${qemu:-0} >= 10)) || backports+=(qemu-system-x86 qemu-utils)
if ((${#backports[@]})); then
	[[ $(id -u) != 0 || -f $BACKPORTS ]] || echo "deb http://deb.debian.org/debian bookworm-backports main" >"$BACKPORTS"
	apt_install "from bookworm-backports" -- "${backports[@]/%//bookworm-backports}"
fi

# The UKI's stub must be bookworm's systemd-stub 252: the PCR 11 prediction
# follows what it measures (internal/imagebuild/uki). A machine that took
# systemd from backports gets bookworm's stub back; systemd-boot-efi holds
# only EFI binaries, so the installed systemd keeps working.
stub=$(dpkg-query -W -f='${Version}' systemd-boot-efi 2>/dev/null || true)
if [[ $stub != 252.* ]]; then
	apt_install "bookworm's systemd-stub 252 in place of ${stub:-none}" --allow-downgrades -- systemd-boot-efi/bookworm
fi

command -v go >/dev/null || {
	log "Go is not in PATH: install Go 1.26 or newer (https://go.dev/doc/install) and add it to PATH (e.g. export PATH=\$PATH:/usr/local/go/bin)"
	exit 1
}
goversion=$(go env GOVERSION)
case "$goversion" in
go1.2[6-9]* | go1.[3-9][0-9]*) ;;
*)
	log "Go $goversion is too old: this module needs Go 1.26 or newer"
	exit 1
	;;
esac

tools=$PWD/build/tools
mkdir -p "$tools"
# staticcheck records its version in the binary; reinstall when the pin moves.
want=${STATICCHECK##*@}
if ! [[ -x $tools/staticcheck ]] || ! go version -m "$tools/staticcheck" 2>/dev/null | grep -q "mod.*honnef.co/go/tools.*$want"; then
	log "installing ${STATICCHECK}"
	GOBIN=$tools GOFLAGS= go install "$STATICCHECK"
fi
want=${GOLANGCI_LINT##*@}
if ! [[ -x $tools/golangci-lint ]] || ! go version -m "$tools/golangci-lint" 2>/dev/null | grep -q "mod.*golangci-lint/v2.*$want"; then
	log "installing ${GOLANGCI_LINT} (a few minutes the first time)"
	GOBIN=$tools GOFLAGS= go install "$GOLANGCI_LINT"
fi
