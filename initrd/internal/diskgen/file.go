// Package diskgen proves, at a rejoin, that the state disk the ticket's
// key opened is not an older copy of itself. The host can swap a node's
// state disk for a copy it took earlier; the same key opens it, and the
// node would run with its old state (an etcd, kubelet's files, workloads'
// data from before). So the disk keeps a generation inside the encrypted
// filesystem (File), where the host cannot change it, and the join
// service's record of the disk keeps the generation it held when the
// node last booted on it.
//
// At every rejoin, before the node locks itself to its cluster, a Checker
// presents the disk's generation to a join service of the node's own
// cluster (joinpb CheckDiskGeneration), writes and syncs the next
// generation the service answers, and has the service record it
// (RecordDiskGeneration); only then does the boot go on. A disk the
// service refuses is not written to: the boot stops, saying what to do.
// internal/records/admitted describes the record's side, and why the node must
// not write before the check.
package diskgen

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// File is where the state disk keeps its generation (in the OS; the
// initrd finds it under its sysroot), beside the measurement salt. A
// disk without it has generation 0: it never rejoined since generations
// exist.
const File = handoff.StateDir + "/disk-generation"

// maxFile bounds what Read reads: a generation is at most 16 digits and
// a newline.
const maxFile = 64

// Read returns the generation the file at path holds, 0 if there is no
// file. Root on the node can write the state disk, so the file must be a
// regular file in a directory (no symbolic link, which the initrd would
// follow into its own files, no FIFO to hang on), and what it holds is
// checked (Parse).
func Read(path string) (uint64, error) {
	if fi, err := os.Lstat(filepath.Dir(path)); err == nil && !fi.IsDir() {
		return 0, fmt.Errorf("read the state disk's generation: %s is a %s, not a directory", filepath.Dir(path), fi.Mode().Type())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the state disk's generation (%s must be a regular file): %w", path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("read the state disk's generation: %s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return 0, fmt.Errorf("read the state disk's generation: %w", err)
	}
	g, err := Parse(b)
	if err != nil {
		return 0, fmt.Errorf("the state disk's generation (%s): %w", path, err)
	}
	return g, nil
}

// Parse reads a generation as Write writes it: a decimal number from 1
// to admitted.MaxGeneration without leading zeros or sign, then a
// newline.
func Parse(b []byte) (uint64, error) {
	if len(b) > maxFile {
		return 0, fmt.Errorf("%d bytes or more, not a generation", len(b))
	}
	digits, ok := cutNewline(b)
	if !ok || len(digits) == 0 || digits[0] == '0' {
		return 0, fmt.Errorf("%.20q is not a generation (a number from 1, then a newline)", b)
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%.20q is not a generation (a number from 1, then a newline)", b)
		}
	}
	g, err := strconv.ParseUint(string(digits), 10, 64)
	if err != nil || g > admitted.MaxGeneration {
		return 0, fmt.Errorf("%.20q is more than %d, which no join service issues", b, uint64(admitted.MaxGeneration))
	}
	return g, nil
}

func cutNewline(b []byte) ([]byte, bool) {
	if len(b) == 0 || b[len(b)-1] != '\n' {
		return nil, false
	}
	return b[:len(b)-1], true
}

// Write replaces the file at path with generation g, durably: once it
// returns, a crash or power cut leaves g on the disk (atomicfile syncs
// the file, renames it into place and syncs the directory).
func Write(path string, g uint64) error {
	if g == 0 || g > admitted.MaxGeneration {
		return fmt.Errorf("write the state disk's generation: %d is not one from 1 to %d", g, uint64(admitted.MaxGeneration))
	}
	if err := atomicfile.WriteFile(path, []byte(strconv.FormatUint(g, 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("write the state disk's generation: %w", err)
	}
	return nil
}
