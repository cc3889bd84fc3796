// Package hostkernel finds the Debian cloud kernel installed on the build
// host, which the initrd is built for and which the local cloud's tests
// boot directly.
package hostkernel

import (
	"errors"
	"path/filepath"
	"strings"
)

// Glob matches the Debian cloud kernels in /boot.
const Glob = "/boot/vmlinuz-*-cloud-amd64"

// Newest returns the path and release of the newest Debian cloud kernel in
// /boot.
func Newest() (path, release string, err error) {
	paths, _ := filepath.Glob(Glob)
	if len(paths) == 0 {
		return "", "", errors.New("no Debian cloud kernel in /boot: install linux-image-cloud-amd64 (make deps)")
	}
	path = newest(paths)
	return path, strings.TrimPrefix(filepath.Base(path), "vmlinuz-"), nil
}

// newest picks the path with the highest version, comparing runs of
// digits as numbers ("6.1.0-56" is newer than "6.1.0-9").
func newest(paths []string) string {
	best := paths[0]
	for _, p := range paths[1:] {
		if compareVersions(p, best) > 0 {
			best = p
		}
	}
	return best
}

func compareVersions(a, b string) int {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		switch {
		case da != "" && db != "":
			// Numbers: the longer (without leading zeros) is larger.
			na, nb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if len(na) != len(nb) {
				return cmpInt(len(na), len(nb))
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[len(da):], b[len(db):]
		default:
			if a[0] != b[0] {
				return cmpInt(int(a[0]), int(b[0]))
			}
			a, b = a[1:], b[1:]
		}
	}
	return cmpInt(len(a), len(b))
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
