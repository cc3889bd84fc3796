#!/usr/bin/env bash
# proto.sh generates the Go code for the wire protocols under internal/proto,
# with pinned tools, so that the same .proto files always give the same bytes.
#
#   hack/proto.sh gen     regenerate every *.pb.go and *_grpc.pb.go in place
#   hack/proto.sh check   fail if the committed generated code is stale
#
# Tools:
#   protoc              from Debian 12's protobuf-compiler package, must report
#                       "libprotoc 3.21.12" (set PROTOC to use another binary
#                       of that same version)
#   protoc-gen-go       google.golang.org/protobuf, the version in go.mod
#   protoc-gen-go-grpc  google.golang.org/grpc/cmd/protoc-gen-go-grpc
# The two plugins are installed by this script into build/tools and only
# taken from there, never from PATH or GOPATH/bin.
#
# Both modes generate into a temporary directory that holds a copy of the
# .proto files at the same relative paths, running protoc there with relative
# paths only, so no absolute path ends up in the output. "gen" then replaces
# the committed files with the result (and deletes generated files whose
# .proto is gone); "check" compares.
set -euo pipefail

readonly PROTOC_VERSION="libprotoc 3.21.12"
readonly PROTOC_GEN_GO_PKG="google.golang.org/protobuf/cmd/protoc-gen-go"
readonly PROTOC_GEN_GO_VERSION="v1.36.12"
readonly PROTOC_GEN_GO_GRPC_PKG="google.golang.org/grpc/cmd/protoc-gen-go-grpc"
readonly PROTOC_GEN_GO_GRPC_VERSION="v1.6.2"
readonly PROTO_ROOT="internal/proto"

export LC_ALL=C

die() {
	echo "hack/proto.sh: $*" >&2
	exit 1
}

usage() {
	echo "usage: hack/proto.sh gen|check" >&2
	exit 2
}

[[ $# -eq 1 ]] || usage
mode=$1
case "$mode" in
gen | check) ;;
*) usage ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
tools="$repo/build/tools"
protoc=${PROTOC:-protoc}

check_protoc() {
	command -v "$protoc" >/dev/null ||
		die "protoc not found: install Debian 12's protobuf-compiler package (apt-get install protobuf-compiler)"
	local got
	got=$("$protoc" --version)
	[[ $got == "$PROTOC_VERSION" ]] ||
		die "'$protoc --version' says '$got', want '$PROTOC_VERSION' (Debian 12's protobuf-compiler); another protoc writes different code"
}

# protoc-gen-go must be the google.golang.org/protobuf release go.mod uses,
# so the generated code always matches the runtime it is compiled with: bump
# PROTOC_GEN_GO_VERSION together with go.mod.
check_go_mod() {
	local got
	# Ask go for the selected version rather than grepping go.mod, without
	# the caller's GOFLAGS or go.work, which could point elsewhere.
	got=$(env -u GOFLAGS GOWORK=off go list -mod=readonly -m -f '{{.Version}}' google.golang.org/protobuf) ||
		die "cannot read the google.golang.org/protobuf version from go.mod"
	[[ $got == "$PROTOC_GEN_GO_VERSION" ]] ||
		die "go.mod has google.golang.org/protobuf $got but this script pins protoc-gen-go $PROTOC_GEN_GO_VERSION: change PROTOC_GEN_GO_VERSION in hack/proto.sh to match and run 'make proto'"
}

# install_tool BINARY PACKAGE VERSION WANT_VERSION_OUTPUT
# installs PACKAGE@VERSION into build/tools unless the binary there already
# reports WANT_VERSION_OUTPUT.
install_tool() {
	local bin=$1 pkg=$2 version=$3 want=$4
	if [[ -x "$tools/$bin" ]] && [[ $("$tools/$bin" --version 2>/dev/null) == "$want" ]]; then
		return
	fi
	echo "hack/proto.sh: installing $pkg@$version into build/tools" >&2
	mkdir -p "$tools"
	# GOFLAGS is dropped because flags meant for this module (-mod=vendor...)
	# do not apply to, or break, 'go install pkg@version'.
	env -u GOFLAGS GOWORK=off GOBIN="$tools" go install "$pkg@$version" ||
		die "could not install $pkg@$version"
	[[ $("$tools/$bin" --version) == "$want" ]] ||
		die "$tools/$bin does not report '$want' after installing it"
}

# generate DIR: copy every .proto under PROTO_ROOT into DIR at the same
# relative path and generate the Go code next to each copy.
generate() {
	local out=$1 f
	while IFS= read -r -d '' f; do
		mkdir -p "$out/$(dirname "$f")"
		cp "$f" "$out/$f"
	done < <(find "$PROTO_ROOT" -name '*.proto' -print0)

	(
		cd "$out"
		# One protoc run per file, in a fixed order, each seeing only
		# relative paths from the (temporary) repository root.
		while IFS= read -r f; do
			"$protoc" \
				-I . \
				--plugin=protoc-gen-go="$tools/protoc-gen-go" \
				--plugin=protoc-gen-go-grpc="$tools/protoc-gen-go-grpc" \
				--go_out=. --go_opt=paths=source_relative \
				--go-grpc_out=. --go-grpc_opt=paths=source_relative \
				"$f" || die "protoc failed on $f"
		done < <(find "$PROTO_ROOT" -name '*.proto' | sort)
	)
}

# generated_files DIR: the generated Go files under DIR/PROTO_ROOT, relative
# to DIR, sorted.
generated_files() {
	(cd "$1" && find "$PROTO_ROOT" -name '*.pb.go' | sort)
}

check_protoc
check_go_mod
install_tool protoc-gen-go "$PROTOC_GEN_GO_PKG" "$PROTOC_GEN_GO_VERSION" \
	"protoc-gen-go $PROTOC_GEN_GO_VERSION"
install_tool protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_PKG" "$PROTOC_GEN_GO_GRPC_VERSION" \
	"protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"

case "$mode" in
gen)
	while IFS= read -r f; do
		[[ -e "$tmp/$f" ]] || { echo "hack/proto.sh: removing $f (no .proto generates it)" >&2; rm -f "$f"; }
	done < <(generated_files "$repo")
	while IFS= read -r f; do
		cmp -s "$tmp/$f" "$f" 2>/dev/null || cp "$tmp/$f" "$f"
	done < <(generated_files "$tmp")
	;;
check)
	stale=()
	while IFS= read -r f; do
		if [[ ! -e "$tmp/$f" ]]; then
			stale+=("$f (no .proto generates it)")
		elif [[ ! -e "$f" ]]; then
			stale+=("$f (missing)")
		elif ! cmp -s "$tmp/$f" "$f"; then
			stale+=("$f (differs)")
		fi
	done < <({ generated_files "$repo"; generated_files "$tmp"; } | sort -u)
	if [[ ${#stale[@]} -gt 0 ]]; then
		echo "generated protobuf code is stale: run 'make proto'" >&2
		printf '  %s\n' "${stale[@]}" >&2
		exit 1
	fi
	;;
esac
