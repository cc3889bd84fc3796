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
	linux-image-cloud-amd64 # the kernel the local cloud's tests boot
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

missing=()
for p in "${PACKAGES[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if ((${#missing[@]})); then
	if [[ $(id -u) != 0 ]]; then
		log "missing Debian packages: ${missing[*]}"
		log "run 'sudo make deps' once (or: sudo apt-get install ${missing[*]})"
		exit 1
	fi
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
