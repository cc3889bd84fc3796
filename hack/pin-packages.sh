#!/usr/bin/env bash
# pin-packages.sh: rewrites image/packages/packages.lock with the versions
# Debian's archive serves today ('make pin-packages'): the newest 6.12
# cloud kernel of bookworm-backports, bookworm's systemd-boot-efi 252, and
# every package of the OS tree mkosi builds from mkosi.conf, each with the
# SHA-256 and pool path the archive's signed indices give. apt runs with a
# state of its own in build/apt: the host's sources, lists and packages
# stay as they are. Nothing is installed. The image built after it has
# other measurements; commit the lock with the change that needs it.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. image/packages/packages.sh

say() { printf 'pin-packages: %s\n' "$*" >&2; }

apt_dir=$PWD/build/apt
mkdir -p "$apt_dir"/{state/lists/partial,cache/archives/partial}
cat >"$apt_dir/sources.list" <<SOURCES
deb $PACKAGES_ARCHIVE/debian bookworm main
deb $PACKAGES_ARCHIVE/debian bookworm-updates main
deb $PACKAGES_ARCHIVE/debian bookworm-backports main
deb $PACKAGES_ARCHIVE/debian-security bookworm-security main
SOURCES
apt_opts=(-o "Dir::State=$apt_dir/state" -o "Dir::Cache=$apt_dir/cache" -o "Dir::Etc::SourceList=$apt_dir/sources.list"
	-o Dir::Etc::SourceParts=/nonexistent -o Dir::State::status=/dev/null -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0)
say "reading the archive's indices into $apt_dir (the host's apt is not touched)"
apt-get "${apt_opts[@]}" -qq update

# uri NAME=VERSION|NAME/SUITE: the lock's "NAME VERSION SHA256 POOL-PATH".
uri() {
	local line url file sha version
	line=$(apt-get "${apt_opts[@]}" download --print-uris "$1" 2>/dev/null | head -n1) ||
		true
	[[ -n $line ]] || {
		say "the archive has no $1"
		exit 1
	}
	read -r url file _ sha <<<"$line"
	url=${url//\'/}
	version=$(apt-cache "${apt_opts[@]}" show "$1" | awk '/^Version:/ {print $2; exit}')
	[[ $1 == *=* ]] && version=${1#*=}
	# The path on the archive's host: debian/pool/... or debian-security/pool/...
	url=${url#*://}
	printf '%s %s %s %s\n' "${1%%[=/]*}" "$version" "${sha#SHA256:}" "${url#*/}"
}

# The kernel: the package the cloud meta-package of backports names.
meta=$(apt-cache "${apt_opts[@]}" show linux-image-cloud-amd64/bookworm-backports | awk '/^Depends:/ {print $2; exit}')
[[ $meta == linux-image-*-cloud-amd64* ]] || {
	say "linux-image-cloud-amd64 of bookworm-backports depends on '$meta', not a cloud kernel"
	exit 1
}
kernel_pkg=${meta%%,*}
kernel_version=$(apt-cache "${apt_opts[@]}" show "$kernel_pkg" | awk '/^Version:/ {print $2; exit}')
stub_version=$(apt-cache "${apt_opts[@]}" madison systemd-boot-efi | awk '$3 ~ /^252\./ {print $3; exit}')

tree_manifest=$(ls -t build/cache/image/tree-*.manifest 2>/dev/null | head -n1 || true)
[[ -n $tree_manifest ]] || {
	say "no OS tree built yet: run 'make image' once (it builds the tree before it checks it), then this again"
	exit 1
}
say "the OS tree's packages from $tree_manifest"

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
	printf '# The Debian packages the node image is made of, pinned: ROLE NAME VERSION SHA256 POOL-PATH.\n'
	printf '# Written by hack/pin-packages.sh (make pin-packages); image/packages/README.md says what changes with it.\n'
	printf 'kernel %s\n' "$(uri "$kernel_pkg=$kernel_version")"
	printf 'stub %s\n' "$(uri "systemd-boot-efi=$stub_version")"
	# One apt call for them all: each loads every index anew.
	declare -A versions
	while read -r name version; do
		versions[$name]=$version
	done < <(jq -r '.packages[] | "\(.name) \(.version)"' "$tree_manifest")
	args=()
	for name in "${!versions[@]}"; do
		args+=("$name=${versions[$name]}")
	done
	apt-get "${apt_opts[@]}" download --print-uris "${args[@]}" |
		while read -r url file _ sha; do
			url=${url//\'/}
			url=${url#*://}
			name=${file%%_*}
			printf 'tree %s %s %s %s\n' "$name" "${versions[$name]}" "${sha#SHA256:}" "${url#*/}"
		done | sort
	[[ ${PIPESTATUS[0]} == 0 ]] || {
		say "the archive does not serve every package of the tree at its version"
		exit 1
	}
} >"$tmp"
mv "$tmp" "$PACKAGES_LOCK"
trap - EXIT
say "wrote $PACKAGES_LOCK: kernel $kernel_pkg $kernel_version, systemd-boot-efi $stub_version, $(grep -c '^tree ' "$PACKAGES_LOCK") tree packages"
