# packages.sh: the Debian packages the node image is made of, pinned in
# image/packages/packages.lock, fetched into build/packages and checked
# there, never taken from (or installed on) the build host. Sourced by
# image/build.sh and hack/pin-packages.sh; bash.
#
# packages.lock has one package a line:
#   ROLE NAME VERSION SHA256 POOL-PATH
# ROLE is kernel (the node's kernel and its modules), stub (systemd-stub
# for the UKI) or tree (a package of the OS tree mkosi installs).
# POOL-PATH is the .deb's path on the Debian archive's host
# (debian/pool/... or debian-security/pool/...).

readonly PACKAGES_LOCK=image/packages/packages.lock
readonly PACKAGES_ARCHIVE=${ORRERY_DEBIAN_ARCHIVE:-http://deb.debian.org}
readonly PACKAGES_DIR=build/packages
readonly PACKAGES_PIN_HINT="run 'make pin-packages' to pin the archive's current versions (it rewrites $PACKAGES_LOCK; the image's measurements change with it, see image/packages/README.md)"

packages_die() {
	printf 'image: error: %s\n' "$*" >&2
	exit 1
}

# packages_lines ROLE: the lock's lines of ROLE.
packages_lines() {
	[[ -f $PACKAGES_LOCK ]] || packages_die "no $PACKAGES_LOCK: $PACKAGES_PIN_HINT"
	awk -v r="$1" '$1 == r' "$PACKAGES_LOCK"
}

# packages_digest: the lock's SHA-256, which the image records.
packages_digest() { sha256sum "$PACKAGES_LOCK" | cut -d' ' -f1; }

# packages_fetch ROLE: downloads each .deb of ROLE into
# build/packages/debs (once), checks its SHA-256 against the lock,
# unpacks it into build/packages/NAME_VERSION (once), and prints that
# folder, a line each.
packages_fetch() {
	local role=$1 name version sha path deb dir got
	mkdir -p "$PACKAGES_DIR/debs"
	while read -r _ name version sha path; do
		deb=$PACKAGES_DIR/debs/${path##*/}
		dir=$PACKAGES_DIR/${name}_${version}
		if [[ ! -f $deb ]] || [[ $(sha256sum "$deb" | cut -d' ' -f1) != "$sha" ]]; then
			rm -f "$deb" "$deb.part"
			curl -fsS --retry 3 -o "$deb.part" "$PACKAGES_ARCHIVE/$path" ||
				packages_die "cannot fetch $name $version from $PACKAGES_ARCHIVE/$path: the archive may have replaced it with a newer version; $PACKAGES_PIN_HINT"
			got=$(sha256sum "$deb.part" | cut -d' ' -f1)
			[[ $got == "$sha" ]] ||
				packages_die "$name $version from $PACKAGES_ARCHIVE/$path has SHA-256 $got, the lock pins $sha: refusing it (the mirror serves another file under that name)"
			mv "$deb.part" "$deb"
		fi
		# .done holds the digest of the .deb unpacked there.
		if [[ $(cat "$dir.done" 2>/dev/null) != "$sha" ]]; then
			rm -rf "$dir" "$dir.done"
			dpkg-deb -x "$deb" "$dir" || packages_die "cannot unpack $deb"
			printf '%s\n' "$sha" >"$dir.done"
		fi
		printf '%s\n' "$dir"
	done < <(packages_lines "$role")
}

# packages_check_tree MANIFEST DEBS: the OS tree mkosi built (its
# manifest.json) holds exactly the lock's tree packages, at their
# versions, and each .deb mkosi installed (in DEBS, mkosi's package
# cache) has the lock's SHA-256.
packages_check_tree() {
	local manifest=$1 debs=$2 want have diff name version sha path deb got
	want=$(packages_lines tree | awk '{print $2 " " $3}' | sort)
	have=$(jq -r '.packages[] | "\(.name) \(.version)"' "$manifest" | sort)
	if [[ $want != "$have" ]]; then
		diff=$(diff <(printf '%s\n' "$want") <(printf '%s\n' "$have") | grep '^[<>]' | sed 's/^</  pinned:/; s/^>/  built: /' | head -20)
		packages_die "the OS tree mkosi built differs from the pinned packages:
$diff
$PACKAGES_PIN_HINT"
	fi
	local arch
	while read -r _ name version sha path; do
		# apt's cache names a .deb NAME_VERSION_ARCH.deb, with an epoch's
		# colon as %3a; the pool's name has no epoch.
		arch=${path##*_}
		deb=$debs/${name}_${version//:/%3a}_${arch}
		[[ -f $deb ]] || continue # a tree from a cache whose .debs went
		got=$(sha256sum "$deb" | cut -d' ' -f1)
		[[ $got == "$sha" ]] ||
			packages_die "mkosi installed $name $version with SHA-256 $got, the lock pins $sha: refusing the tree (the mirror serves another file under that version)"
	done < <(packages_lines tree)
}
