#!/usr/bin/env bash
# deps.sh installs, idempotently, the tools the build and the tests run on
# a Debian 12 machine: Debian packages (only those missing; apt-get update
# runs only if something is missing) and pinned Go tools into build/tools.
# It is what 'make deps' runs, and every other make target runs it first.
# It installs no kernel, bootloader or systemd on the host and downgrades
# nothing: what goes into the node image (its kernel, systemd-stub, the OS
# tree's packages) is pinned in image/packages/packages.lock and fetched
# into build/packages (image/packages/fetch.sh), never installed here.
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
	mkosi dosfstools mtools cpio busybox-static # 'make image': OS tree, ESP
	curl kmod        # 'make packages': fetch the pinned kernel and stub, depmod their modules
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
		log "run 'make deps' once as root (for example 'sudo make deps'); it installs only what is missing"
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

# QEMU 10 from bookworm-backports, named as PACKAGE/bookworm-backports:
# apt takes only these, and those of their dependencies whose version
# bookworm lacks, from there ('-t bookworm-backports' would take every
# new dependency from there). Under bookworm's QEMU 7.2, TCG broke the
# node's 6.12 kernel at random (double faults, spurious debug exceptions,
# garbage RFLAGS; 3 of 4 boots of the initrd's VM test died). It is the one
# thing from outside bookworm's main archive, said before it is added.
readonly BACKPORTS=/etc/apt/sources.list.d/orrery-bookworm-backports.list
qemu=$(qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p')
if ((${qemu:-0} < 10)); then
	log "the local cloud needs QEMU 10 (this machine has ${qemu:-none}), from bookworm-backports:"
	if [[ ! -f $BACKPORTS ]]; then
		log "  adding the apt source $BACKPORTS: deb http://deb.debian.org/debian bookworm-backports main"
	fi
	log "  installing qemu-system-x86/bookworm-backports qemu-utils/bookworm-backports (nothing else is taken from backports)"
	if [[ $(id -u) == 0 && ! -f $BACKPORTS ]]; then
		echo "deb http://deb.debian.org/debian bookworm-backports main" >"$BACKPORTS"
	fi
	apt_install "QEMU 10 from bookworm-backports" -- qemu-system-x86/bookworm-backports qemu-utils/bookworm-backports
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
