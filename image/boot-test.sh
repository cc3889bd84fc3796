#!/usr/bin/env bash
# boot-test.sh IMAGEDIR: boots IMAGEDIR/disk.qcow2 (from 'make image') on the
# local cloud under OVMF + swtpm with a blank state disk and checks from
# outside: the console's PCRs and 'orrery verify' against
# IMAGEDIR/measurements.json, port 9000, bootstrapperd waiting for init or
# join, a LUKS2 state disk. 'make boot-test' runs it on build/image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=$PATH:/usr/local/go/bin
dir=${1:?usage: image/boot-test.sh IMAGEDIR}
[[ ${DEBUG:-0} == 1 ]] && dir=${dir%/}-debug
[[ $(id -u) == 0 ]] || { echo "boot-test: needs root (network namespace, bridge, taps): run 'sudo make boot-test'" >&2; exit 1; }
[[ -f $dir/disk.qcow2 && -f $dir/measurements.json ]] || { echo "boot-test: no image in $dir: run 'make image' first" >&2; exit 1; }
mkdir -p build/bin
CGO_ENABLED=0 go build -trimpath -o build/bin/orrery ./cli
debug=()
[[ -f ${dir%/}-debug/disk.qcow2 ]] && debug=(-debug-image-dir "$PWD/${dir%/}-debug")
exec go test -tags boottest -count=1 -timeout 30m -v ./image/boottest \
	-args -image-dir "$PWD/$dir" -orrery "$PWD/build/bin/orrery" "${debug[@]}"
