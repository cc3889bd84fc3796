#!/usr/bin/env bash
# build.sh OUTDIR: builds the node's upstream components from Go modules pinned
# in the modules beside this script, and the container images kubeadm needs,
# for every Kubernetes release under releases/ (one folder per minor).
#
#   OUTDIR/bin/        containerd containerd-shim-runc-v2 ctr runc orrery-images
#   OUTDIR/hostbin/    helm and kubectl (the newest release's), for the owner's workstation
#   OUTDIR/cni/bin/    bridge host-local loopback portmap flannel
#   OUTDIR/images/     flannel's OCI image archive (image/build.sh unpacks it for orrery-images)
#   OUTDIR/releases/vX.Y.Z/bin/     kubeadm kubelet kubectl of that release
#   OUTDIR/releases/vX.Y.Z/images/  its control-plane, etcd, CoreDNS and pause image archives
#   OUTDIR/releases/vX.Y.Z/manifest.json  every binary and image a node of that release
#                         runs: version, path, install path, sha256, digest
#   OUTDIR/manifest.json  the releases' manifests, as a JSON array (written last)
#   OUTDIR/timings.txt    seconds per component of the last run
#
# Idempotent and cached: a component is rebuilt only when its cache key (Go
# version, its module's go.mod and go.sum, its build recipe; for an image: the
# bytes of every file that goes into it) changed or its output is missing.
#
# Environment:
#   ORRERY_UPDATE_VERSIONS=1  also copy each release's manifest.json to
#                             internal/versions/versions_vX.Y.Z.json (the data
#                             the main module embeds); without it, a
#                             difference is reported as a warning.
#   ORRERY_COMPONENTS_ONLY=testbin  build only what the tests that run a real
#                             API server need (below), of the newest release.
set -euo pipefail

readonly HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly REPO=$(cd "$HERE/../.." && pwd)
export PATH=$PATH:/usr/local/go/bin
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

readonly FLANNEL_REF=ghcr.io/flannel-io/flannel:v0.28.4
readonly REGISTRY=registry.k8s.io
# Fixed install locations on the node. A release's kubeadm, kubelet and
# kubectl live in NODE_RELEASES/vX.Y.Z/; /usr/bin/kubeadm and the others
# are links through /run/orrery/kubernetes, which the node points at the
# release its cluster runs (image/build.sh, bootstrapperd).
readonly NODE_BIN=/usr/bin NODE_CNI=/opt/cni/bin NODE_IMAGES=/usr/share/orrery/images
readonly NODE_RELEASES=/usr/lib/orrery/kubernetes
# Every release folder, oldest first; the newest is the default.
mapfile -t RELEASES < <(cd "$HERE/releases" && ls -d v*/ | tr -d / | sort -V)
((${#RELEASES[@]} > 0)) || { echo "components: no release under $HERE/releases" >&2; exit 1; }

usage() { echo "usage: $0 OUTDIR" >&2; exit 2; }
(($# == 1)) || usage
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
readonly OUT
mkdir -p "$OUT/bin" "$OUT/cni/bin" "$OUT/images" "$OUT/imagebin" "$OUT/.cache" "$OUT/.work" "$OUT/hostbin" "$OUT/releases"

log() { printf 'components: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in go jq gcc ldd sha256sum dpkg-query; do
	command -v "$tool" >/dev/null || die "$tool not found: run 'make deps' (as root) first"
done
[[ -f /usr/lib/x86_64-linux-gnu/libseccomp.a ]] || die "libseccomp.a missing (runc links it statically): apt-get install libseccomp-dev"
[[ -x /usr/sbin/xtables-nft-multi && -x /usr/sbin/nft ]] || die "iptables/nft missing (copied into kube-proxy and flannel images): apt-get install iptables nftables"
{ ldd /bin/busybox 2>&1 || true; } | grep -q 'not a dynamic' || die "static busybox missing (the flannel image's shell): apt-get install busybox-static"

readonly GOVERSION=$(go env GOVERSION)
TIMINGS=()
START_ALL=$(date +%s)

# modinfo DIR MODULE: "<version> <commit> <commit time>" of MODULE as pinned in
# the module at DIR, from the module proxy's .info record.
modinfo() {
	local dir=$1 mod=$2 ver js
	ver=$(cd "$HERE/$dir" && go list -m -f '{{.Version}}' "$mod")
	js=$(cd "$HERE/$dir" && go mod download -json "$mod@$ver")
	local info hash time
	info=$(jq -r '.Info' <<<"$js")
	hash=$(jq -r '.Origin.Hash // empty' "$info")
	time=$(jq -r '.Time' "$info")
	[[ -n $hash ]] || hash=unknown
	echo "$ver $hash $time"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# cached NAME KEY OUTPUT...: true (skip) when NAME was last built with KEY
# and every OUTPUT exists.
cached() {
	local name=$1 key=$2 f
	shift 2
	[[ -f $OUT/.cache/$name.key && $(<"$OUT/.cache/$name.key") == "$key" ]] || return 1
	for f in "$@"; do [[ -e $f ]] || return 1; done
}

# srcsum DIR PKG: for a package of ours (./...), the sha256 of its files.
srcsum() {
	[[ $2 == ./* ]] || return 0
	(cd "$HERE/$1/$2" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
}

# gobuild NAME DIR PKG OUTPUT CGO TAGS LDFLAGS [EXTRA GO FLAGS...]
gobuild() {
	local name=$1 dir=$2 pkg=$3 output=$4 cgo=$5 tags=$6 ldflags=$7
	shift 7
	local key
	key=$(printf '%s\n' "$GOVERSION" "$pkg" "$cgo" "$tags" "$ldflags" "$*" \
		"$(cat "$HERE/$dir/go.mod" "$HERE/$dir/go.sum" 2>/dev/null)" \
		"$( ((cgo)) && dpkg-query -W -f='${Package}=${Version}\n' libc6-dev libseccomp-dev gcc-12 || true)" \
		"$(srcsum "$dir" "$pkg")" |
		sha256sum | cut -d' ' -f1)
	local t0=$(date +%s)
	if cached "$name" "$key" "$output"; then
		log "$name: up to date"
	else
		log "$name: building $pkg"
		(cd "$HERE/$dir" && CGO_ENABLED=$cgo go build -trimpath -tags "$tags" -ldflags "$ldflags" "$@" -o "$output.tmp" "$pkg") ||
			die "$name: go build $pkg failed"
		mv "$output.tmp" "$output"
		echo "$key" >"$OUT/.cache/$name.key"
	fi
	local dt=$(($(date +%s) - t0))
	TIMINGS+=("$name $dt")
	log "$name: ${dt}s $(du -h "$output" | cut -f1)"
}

# patched_modfile DIR MODULE NAME FILE FROM TO [FILE FROM TO]...: builds
# MODULE, as the module at DIR pins it, from a copy under .work/NAME in which
# each FILE has its line FROM replaced by TO, and prints the go.mod (for
# -modfile) that points DIR's module at the copy. A Go overlay cannot replace
# files in the module cache, hence the copy. The build stops when a line is
# not there exactly once, rather than ship the upstream code unchanged.
patched_modfile() {
	local dir=$1 module=$2 name=$3 src dst=$OUT/.work/$3 files=()
	shift 3
	src=$(cd "$HERE/$dir" && go list -m -f '{{.Dir}}' "$module")
	# The copy is redone only for another version (a module's directory in
	# the cache names its version); the patched files are rewritten from
	# the module every time below.
	if [[ ! -f $dst.source || $(<"$dst.source") != "$src" ]]; then
		rm -rf "$dst" "$dst.source"
		cp -r "$src" "$dst"
		chmod -R u+w "$dst"
		echo "$src" >"$dst.source"
	fi
	while (($# >= 3)); do
		local file=$1 from=$2 to=$3
		shift 3
		awk -v from="$from" -v to="$to" '$0 == from { print to; n++; next } { print } END { exit n != 1 }' \
			"$src/$file" >"$dst/$file" ||
			die "$name: $src/$file does not have the line '$from' once: check the new version's code, then the patch in build.sh"
		files+=("$dst/$file")
	done
	# Relative to the module, so that the path the binary records (its
	# build info names a replacement) is the same in every clone.
	local rel mod
	rel=$(realpath --relative-to="$HERE/$dir" "$dst")
	[[ $rel == ../* ]] || rel=./$rel
	# Named by the patched files and the replacement, so that a change of
	# either is a change of gobuild's cache key.
	mod=$OUT/.work/$name-$({ cat "${files[@]}"; echo "$rel"; } | sha256sum | cut -c1-16).mod
	cp "$HERE/$dir/go.mod" "$mod"
	cp "$HERE/$dir/go.sum" "${mod%.mod}.sum"
	(cd "$HERE/$dir" && go mod edit -modfile="$mod" -replace "$module=$rel")
	echo "$mod"
}

# kube-apiserver kills itself (klog.Fatalf) when one of three start-up
# tasks has not finished in time, each a constant: the first check of
# Service IPs and node ports (start-service-ip-repair-controllers, 1 min)
# and writing the default RBAC roles (rbac/bootstrap-roles, 30 s) and the
# system priority classes (scheduling/bootstrap-system-priority-classes,
# 30 s), all through etcd. On a starved control plane etcd is not that
# fast: under hack/stress-e2e.sh the API server's first start died with
# "PostStartHook start-service-ip-repair-controllers failed: unable to
# perform initial IP and Port allocation check" after 50 s of etcd
# connection errors (kubelet-start then took 5 min), and after a control
# plane's reboot the API server refused connections for minutes once the
# node was Ready. kubelet restarts it with growing back-off, and
# each start costs minutes of guest CPU, so a slow minute becomes an
# outage. The same binary gives its fourth such task, the flow-control
# bootstrap, 5 minutes; kube-apiserver is built with 5 minutes for these
# three as well. An API server whose etcd never answers still exits, later.
k8s_apiserver_modfile() { # RELEASE-DIR VERSION
	local poll='err := wait.Poll(1*time.Second, %s, func() (done bool, err error) {'
	local from to
	from=$(printf "\t\t$poll" '30*time.Second')
	to=$(printf "\t\t$poll" '5*time.Minute')
	patched_modfile "$1/kubernetes" k8s.io/kubernetes "kubernetes-$2" \
		pkg/registry/core/rest/storage_core.go $'\t\tcase <-time.After(time.Minute):' $'\t\tcase <-time.After(5 * time.Minute):' \
		pkg/registry/rbac/rest/storage_rbac.go "$from" "$to" \
		pkg/registry/scheduling/rest/storage_scheduling.go "$from" "$to"
}

# load_release FOLDER: sets REL_DIR, REL_OUT and release.env's K8S_VERSION,
# ETCD_TAG, COREDNS_TAG, PAUSE_TAG, and the pinned modules' versions, and
# checks that the folder's name, release.env and the modules agree.
load_release() {
	local folder=$1
	REL_DIR=releases/$folder
	K8S_VERSION= ETCD_TAG= COREDNS_TAG= PAUSE_TAG=
	# shellcheck source=/dev/null
	source "$HERE/$REL_DIR/release.env"
	[[ -n $K8S_VERSION && -n $ETCD_TAG && -n $COREDNS_TAG && -n $PAUSE_TAG ]] ||
		die "$REL_DIR/release.env must set K8S_VERSION, ETCD_TAG, COREDNS_TAG and PAUSE_TAG"
	[[ $K8S_VERSION == "$folder".* ]] || die "$REL_DIR/release.env names $K8S_VERSION: a release folder holds its minor's one patch version"
	REL_OUT=$OUT/releases/$K8S_VERSION
	mkdir -p "$REL_OUT/bin" "$REL_OUT/imagebin" "$REL_OUT/images"
	read -r K8S_VER K8S_COMMIT K8S_TIME < <(modinfo "$REL_DIR/kubernetes" k8s.io/kubernetes)
	[[ $K8S_VER == "$K8S_VERSION" ]] || die "$REL_DIR/kubernetes/go.mod pins $K8S_VER, its release.env says $K8S_VERSION"
	read -r ETCD_VER ETCD_COMMIT _ < <(modinfo "$REL_DIR/etcd" go.etcd.io/etcd/server/v3)
	[[ ${ETCD_TAG%-*} == "${ETCD_VER#v}" ]] || die "$REL_DIR/etcd/go.mod pins $ETCD_VER, kubeadm $K8S_VERSION expects $ETCD_TAG"
	read -r COREDNS_VER COREDNS_COMMIT _ < <(modinfo "$REL_DIR/coredns" github.com/coredns/coredns)
	[[ $COREDNS_VER == "$COREDNS_TAG" ]] || die "$REL_DIR/coredns/go.mod pins $COREDNS_VER, kubeadm $K8S_VERSION expects $COREDNS_TAG"
	local minor=${K8S_VERSION#v1.} pkg
	minor=${minor%%.*}
	k8s_ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		k8s_ldflags+=" -X $pkg.gitCommit=$K8S_COMMIT -X $pkg.gitTreeState=clean -X $pkg.buildDate=$K8S_TIME"
	done
}

# build_testbin: etcd, kube-apiserver, kube-controller-manager and kubeadm of
# the loaded release.
build_testbin() {
	local modfile
	modfile=$(k8s_apiserver_modfile "$REL_DIR" "$K8S_VERSION")
	gobuild "kube-apiserver-$K8S_VERSION" "$REL_DIR/kubernetes" k8s.io/kubernetes/cmd/kube-apiserver "$REL_OUT/imagebin/kube-apiserver" 0 "" "$k8s_ldflags" \
		-modfile="$modfile"
	gobuild "kubeadm-$K8S_VERSION" "$REL_DIR/kubernetes" k8s.io/kubernetes/cmd/kubeadm "$REL_OUT/bin/kubeadm" 0 "" "$k8s_ldflags"
	# The controller manager signs with the CAs that kubeadm's
	# configuration names (bootstrapperd/internal/kubeadm).
	gobuild "kube-controller-manager-$K8S_VERSION" "$REL_DIR/kubernetes" k8s.io/kubernetes/cmd/kube-controller-manager "$REL_OUT/imagebin/kube-controller-manager" 0 "" "$k8s_ldflags"
	gobuild "etcd-$ETCD_TAG" "$REL_DIR/etcd" ./cmd/etcd "$REL_OUT/imagebin/etcd" 0 "" "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_COMMIT:0:9}"
}

# ---------------------------------------------------------------- binaries

# ORRERY_COMPONENTS_ONLY=testbin builds etcd, kube-apiserver,
# kube-controller-manager and kubeadm of
# the newest release alone, for the tests that run a real API server and
# drive kubeadm against it (internal/testkit/apiservertest; 'make test'),
# and stops: no other binary, no image, no manifest.
if [[ ${ORRERY_COMPONENTS_ONLY:-} == testbin ]]; then
	load_release "${RELEASES[-1]}"
	build_testbin
	exit 0
fi

# build_release_binaries: the loaded release's programs.
build_release_binaries() {
	local c
	for c in kubelet kubectl; do
		gobuild "$c-$K8S_VERSION" "$REL_DIR/kubernetes" "k8s.io/kubernetes/cmd/$c" "$REL_OUT/bin/$c" 0 "" "$k8s_ldflags"
	done
	build_testbin
	for c in kube-scheduler kube-proxy; do
		gobuild "$c-$K8S_VERSION" "$REL_DIR/kubernetes" "k8s.io/kubernetes/cmd/$c" "$REL_OUT/imagebin/$c" 0 "" "$k8s_ldflags"
	done
	gobuild "pause-$PAUSE_TAG" . ./cmd/pause "$REL_OUT/imagebin/pause" 0 "" "-s -w -X main.version=orrery-$PAUSE_TAG"
	gobuild "coredns-$COREDNS_TAG" "$REL_DIR/coredns" github.com/coredns/coredns "$REL_OUT/imagebin/coredns" 0 "" \
		"-s -w -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_COMMIT:0:7}"
}

read -r CTRD_VER CTRD_COMMIT _ < <(modinfo containerd github.com/containerd/containerd/v2)
ctrd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CTRD_VER -X github.com/containerd/containerd/v2/version.Revision=$CTRD_COMMIT -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
# containerd's CRI plugin gives the handling of a container's exit 10 s,
# a constant, and in that time the shim drains the container's output and
# runs `runc delete`. On a starved node (a TCG worker beside a busy
# control plane: StartContainer took 20-60 s) every attempt timed out for
# over 15 minutes, so the container stayed Running to kubelet and was never
# restarted: a worker's flanneld that had exited while the control plane
# was down never came back, and pods lost the network
# (containerd/containerd#13377, open upstream). containerd is built from
# a copy of its module with that one line raised to 60 s.
CTRD_MODFILE=$(patched_modfile containerd github.com/containerd/containerd/v2 containerd-v2 \
	internal/cri/server/events.go $'\thandleEventTimeout = 10 * time.Second' $'\thandleEventTimeout = 60 * time.Second')
gobuild containerd containerd github.com/containerd/containerd/v2/cmd/containerd "$OUT/bin/containerd" 0 "" "$ctrd_ldflags" -modfile="$CTRD_MODFILE"
gobuild containerd-shim-runc-v2 containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$OUT/bin/containerd-shim-runc-v2" 0 "no_grpc" "$ctrd_ldflags"
gobuild ctr containerd github.com/containerd/containerd/v2/cmd/ctr "$OUT/bin/ctr" 0 "" "$ctrd_ldflags"
# Ours, beside the containerd it talks to: links the images the OS image
# bakes into containerd at boot (cmd/orrery-images in containerd/).
gobuild orrery-images containerd ./cmd/orrery-images "$OUT/bin/orrery-images" 0 "" "-s -w"

# runc needs cgo (libcontainer/nsenter) and libseccomp; linked as a static PIE
# so the node needs no libseccomp. Upstream's "libpathrs" tag (a Rust library)
# is left out: runc then uses its Go implementation of the same path handling.
read -r RUNC_VER RUNC_COMMIT _ < <(modinfo runc github.com/opencontainers/runc)
gobuild runc runc github.com/opencontainers/runc "$OUT/bin/runc" 1 "seccomp urfave_cli_no_docs netgo osusergo" \
	"-s -w -X main.gitCommit=$RUNC_COMMIT -linkmode external -extldflags -static-pie" -buildmode=pie

read -r CNI_VER _ _ < <(modinfo cni github.com/containernetworking/plugins)
cni_ldflags="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_VER"
gobuild cni-bridge cni github.com/containernetworking/plugins/plugins/main/bridge "$OUT/cni/bin/bridge" 0 "" "$cni_ldflags"
gobuild cni-host-local cni github.com/containernetworking/plugins/plugins/ipam/host-local "$OUT/cni/bin/host-local" 0 "" "$cni_ldflags"
gobuild cni-loopback cni github.com/containernetworking/plugins/plugins/main/loopback "$OUT/cni/bin/loopback" 0 "" "$cni_ldflags"
gobuild cni-portmap cni github.com/containernetworking/plugins/plugins/meta/portmap "$OUT/cni/bin/portmap" 0 "" "$cni_ldflags"
if [[ -d $HERE/cni/cmd/flannel ]]; then
	gobuild cni-flannel cni ./cmd/flannel "$OUT/cni/bin/flannel" 0 "" "-s -w -X main.pluginVersion=orrery-$CNI_VER"
fi

read -r FLANNEL_VER _ _ < <(modinfo flannel github.com/flannel-io/flannel)
# flannel's UDP backend is C (cgo), as upstream builds it; linked statically so
# the image needs no libc for it.
gobuild flanneld flannel github.com/flannel-io/flannel "$OUT/imagebin/flanneld" 1 "netgo osusergo" \
	"-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VER -linkmode external -extldflags -static"

# The helm CLI for the owner (not on the node): the version of the Helm SDK
# the orrery CLI is built with, so that it reads and rolls back the releases
# orrery writes.
read -r HELM_VER HELM_COMMIT _ < <(modinfo helm helm.sh/helm/v3)
SDK_HELM_VER=$(cd "$REPO" && go list -m -f '{{.Version}}' helm.sh/helm/v3)
[[ $HELM_VER == "$SDK_HELM_VER" ]] || die "helm/go.mod pins $HELM_VER, the orrery CLI's Helm SDK is $SDK_HELM_VER: make them agree"
gobuild helm helm helm.sh/helm/v3/cmd/helm "$OUT/hostbin/helm" 0 "" \
	"-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VER -X helm.sh/helm/v3/internal/version.gitCommit=$HELM_COMMIT -X helm.sh/helm/v3/internal/version.gitTreeState=clean"

gobuild containerimage . ./cmd/containerimage "$OUT/.work/containerimage" 0 "" "-s -w"

# ------------------------------------------------------------------ images

# netfilter_userspace: containerimage arguments that put Debian's iptables (nft
# backend) and nft, with every shared library they load, into an image in
# Debian's merged-/usr layout.
netfilter_userspace() {
	local -a files=(/usr/sbin/xtables-nft-multi /usr/sbin/nft)
	local -a objs=("${files[@]}" /usr/lib/x86_64-linux-gnu/xtables/*.so)
	local f lib
	for f in "${files[@]}"; do echo "-add" "$f:$f"; done
	echo "-add" "/usr/lib/x86_64-linux-gnu/xtables:/usr/lib/x86_64-linux-gnu/xtables"
	for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore \
		iptables-nft iptables-nft-save iptables-nft-restore ip6tables-nft ip6tables-nft-save ip6tables-nft-restore; do
		echo "-link" "/usr/sbin/$tool:xtables-nft-multi"
	done
	for lib in $(ldd "${objs[@]}" 2>/dev/null | awk '/=> \//{print $3} /^[ \t]*\/lib64\//{print $1}' | sort -u); do
		case $lib in
		/lib64/*) echo "-add" "$(readlink -f "$lib"):/usr/lib/x86_64-linux-gnu/$(basename "$(readlink -f "$lib")")"
			echo "-link" "/usr/lib64/$(basename "$lib"):../lib/x86_64-linux-gnu/$(basename "$(readlink -f "$lib")")" ;;
		*) echo "-add" "$(readlink -f "$lib"):/usr/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
		esac
	done
	echo "-link" "/lib:usr/lib" "-link" "/lib64:usr/lib64" "-link" "/sbin:usr/sbin" "-link" "/bin:usr/bin"
	echo "-add" "/etc/protocols:/etc/protocols" "-add" "/etc/services:/etc/services"
}
mapfile -t NETFILTER < <(netfilter_userspace | tr ' ' '\n')

# containerimage NAME VERSION REF PINNED OUTDIR CREATED ARGS...: build
# OUTDIR/NAME.tar, installed on the node in NODE_IMAGES under the name the
# tail of REF gives (e.g. kube-apiserver-v1.37.2), and add its manifest
# entry to IMAGES_JSON.
containerimage() {
	local name=$1 version=$2 ref=$3 pinned=$4 dir=$5 created=$6
	shift 6
	local tag=${ref##*:} out=$dir/$name.tar
	local id=$name-$tag t0 key a src prev=
	local meta=$OUT/.cache/$id.image.json
	t0=$(date +%s)
	# The key covers the arguments and the bytes of every file -add copies.
	key=$( {
		echo "$ref" "$created" "$*"
		sha "$OUT/.work/containerimage"
		for a in "$@"; do
			if [[ $prev == -add ]]; then
				src=${a%%:*}
				if [[ -d $src ]]; then find "$src" -type f -print0 | sort -z | xargs -0 sha256sum; else sha "$src"; fi
			fi
			prev=$a
		done
	} | sha256sum | cut -d' ' -f1)
	if cached "image-$id" "$key" "$out" "$meta"; then
		log "image $id: up to date"
	else
		log "image $id: $ref"
		"$OUT/.work/containerimage" -ref "$ref" -out "$out" -created "$created" "$@" >"$meta.tmp" || die "image $id failed"
		mv "$meta.tmp" "$meta"
		echo "$key" >"$OUT/.cache/image-$id.key"
	fi
	IMAGES_JSON+=("$(jq -c --arg name "$name" --arg version "$version" --arg path "$(realpath --relative-to="$OUT" "$out")" \
		--arg install "$NODE_IMAGES/$id" --argjson pinned "$pinned" \
		'{name: $name, version: $version, ref: .ref, path: $path, installPath: $install, sha256: .sha256, size: .size, digest: .digest, configDigest: .config, pinned: $pinned}' "$meta")")
	local dt=$(($(date +%s) - t0))
	TIMINGS+=("image-$id $dt")
	log "image $id: ${dt}s $(du -h "$out" | cut -f1)"
}

# Flannel is the same for every release, and so is pause where two
# releases name the same tag: their images' time is the oldest release's,
# so that both manifests name one image, which the node carries once.
IMAGES_JSON=()
load_release "${RELEASES[0]}"
SHARED_CREATED=$K8S_TIME
BUSYBOX=()
for t in sh cp mkdir cat ls rm mv ln; do BUSYBOX+=(-link "/usr/bin/$t:busybox"); done
containerimage flannel "$FLANNEL_VER" "$FLANNEL_REF" true "$OUT/images" "$SHARED_CREATED" \
	-add "$OUT/imagebin/flanneld:/opt/bin/flanneld" -entrypoint '["/opt/bin/flanneld"]' "${NETFILTER[@]}" \
	-add /bin/busybox:/usr/bin/busybox "${BUSYBOX[@]}"
SHARED_IMAGES_JSON=("${IMAGES_JSON[@]}")

# build_release_images: the loaded release's images, into IMAGES_JSON.
build_release_images() {
	local c dir=$REL_OUT/images
	for c in kube-apiserver kube-controller-manager kube-scheduler; do
		containerimage "$c" "$K8S_VERSION" "$REGISTRY/$c:$K8S_VERSION" true "$dir" "$K8S_TIME" \
			-add "$REL_OUT/imagebin/$c:/usr/local/bin/$c" -entrypoint "[\"/usr/local/bin/$c\"]"
	done
	containerimage kube-proxy "$K8S_VERSION" "$REGISTRY/kube-proxy:$K8S_VERSION" true "$dir" "$K8S_TIME" \
		-add "$REL_OUT/imagebin/kube-proxy:/usr/local/bin/kube-proxy" -entrypoint '["/usr/local/bin/kube-proxy"]' "${NETFILTER[@]}"
	containerimage etcd "$ETCD_VER" "$REGISTRY/etcd:$ETCD_TAG" true "$dir" "$K8S_TIME" \
		-add "$REL_OUT/imagebin/etcd:/usr/local/bin/etcd" -entrypoint '["/usr/local/bin/etcd"]'
	containerimage coredns "$COREDNS_VER" "$REGISTRY/coredns/coredns:$COREDNS_TAG" true "$dir" "$K8S_TIME" \
		-add "$REL_OUT/imagebin/coredns:/coredns" -entrypoint '["/coredns"]'
	containerimage pause "$PAUSE_TAG" "$REGISTRY/pause:$PAUSE_TAG" true "$dir" "$SHARED_CREATED" \
		-add "$REL_OUT/imagebin/pause:/pause" -entrypoint '["/pause"]'
}

# ---------------------------------------------------------------- manifest

bin_entry() { # NAME VERSION MODULE PATH INSTALLPATH
	BINARIES_JSON+=("$(jq -nc --arg name "$1" --arg version "$2" --arg mod "$3" --arg path "$4" \
		--arg install "$5" --arg sha "$(sha "$OUT/$4")" --argjson size "$(stat -c %s "$OUT/$4")" \
		'{name: $name, version: $version, module: $mod, path: $path, installPath: $install, sha256: $sha, size: $size}')")
}
BINARIES_JSON=()
for c in containerd containerd-shim-runc-v2 ctr; do bin_entry "$c" "$CTRD_VER" github.com/containerd/containerd/v2 "bin/$c" "$NODE_BIN/$c"; done
bin_entry runc "$RUNC_VER" github.com/opencontainers/runc bin/runc "$NODE_BIN/runc"
for c in bridge host-local loopback portmap; do bin_entry "$c" "$CNI_VER" github.com/containernetworking/plugins "cni/bin/$c" "$NODE_CNI/$c"; done
if [[ -f $OUT/cni/bin/flannel ]]; then
	bin_entry flannel "$CNI_VER" github.com/orrery-dev/orrery/image/components/cni "cni/bin/flannel" "$NODE_CNI/flannel"
fi
SHARED_BINARIES_JSON=("${BINARIES_JSON[@]}")
HOST_PACKAGES=$(dpkg-query -W -f='${Package}=${Version}\n' libc6 libc6-dev gcc-12 libseccomp-dev iptables nftables busybox-static |
	jq -R . | jq -sc 'map(split("=") | {(.[0]): .[1]}) | add')

# release_manifest: the loaded release's manifest.json, with the shared
# components.
release_manifest() {
	local c
	BINARIES_JSON=()
	for c in kubeadm kubelet kubectl; do
		bin_entry "$c" "$K8S_VERSION" k8s.io/kubernetes "releases/$K8S_VERSION/bin/$c" "$NODE_RELEASES/$K8S_VERSION/$c"
	done
	BINARIES_JSON+=("${SHARED_BINARIES_JSON[@]}")
	jq -n --arg k8s "$K8S_VERSION" --arg go "$GOVERSION" --arg etcd "$ETCD_TAG" --arg coredns "$COREDNS_TAG" \
		--arg pause "$PAUSE_TAG" --arg flannel "$FLANNEL_VER" --arg containerd "$CTRD_VER" --arg runc "$RUNC_VER" \
		--arg cni "$CNI_VER" --argjson host "$HOST_PACKAGES" \
		--argjson binaries "$(printf '%s\n' "${BINARIES_JSON[@]}" | jq -s .)" \
		--argjson images "$(printf '%s\n' "${IMAGES_JSON[@]}" | jq -s .)" '{
		kubernetesVersion: $k8s,
		etcdVersion: $etcd, corednsVersion: $coredns, pauseVersion: $pause, flannelVersion: $flannel,
		containerdVersion: $containerd, runcVersion: $runc, cniPluginsVersion: $cni,
		goVersion: $go,
		hostPackages: $host,
		pinLabel: "io.cri-containerd.pinned=pinned",
		binaries: $binaries,
		images: $images
	}' >"$REL_OUT/manifest.json.tmp"
	mv "$REL_OUT/manifest.json.tmp" "$REL_OUT/manifest.json"
	local versions_file=$REPO/internal/versions/versions_$K8S_VERSION.json
	if [[ ${ORRERY_UPDATE_VERSIONS:-} == 1 ]]; then
		cp "$REL_OUT/manifest.json" "$versions_file"
		log "wrote $versions_file"
	elif ! cmp -s "$REL_OUT/manifest.json" "$versions_file"; then
		log "warning: $versions_file differs from this build's manifest; run with ORRERY_UPDATE_VERSIONS=1 to update it"
	fi
}

# -------------------------------------------------------------- releases

manifests=()
for folder in "${RELEASES[@]}"; do
	load_release "$folder"
	log "release $K8S_VERSION ($REL_DIR)"
	build_release_binaries
	IMAGES_JSON=("${SHARED_IMAGES_JSON[@]}")
	build_release_images
	release_manifest
	manifests+=("$REL_OUT/manifest.json")
done
# The owner's kubectl: the newest release's, which the skew policy lets
# talk to the release before it too.
install -m 0755 "$REL_OUT/bin/kubectl" "$OUT/hostbin/kubectl"
# Releases no folder names any more are left out of the image.
for d in "$OUT"/releases/*/; do
	[[ -f $d/manifest.json ]] && printf '%s\n' "${manifests[@]}" | grep -qxF "${d}manifest.json" || rm -rf "$d"
done

jq -s . "${manifests[@]}" >"$OUT/manifest.json.tmp"
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
total=$(($(date +%s) - START_ALL))
printf '%s\n' "${TIMINGS[@]}" "total $total" >"$OUT/timings.txt"
log "manifest: $OUT/manifest.json (${RELEASES[*]})"
log "total: ${total}s"
