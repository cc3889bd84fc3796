// Package verity opens the node's read-only root filesystem: the erofs
// partition "orrery-root", checked by dm-verity against the hash tree on
// partition "orrery-verity" and the root hash from the measured kernel
// command line, and mounts it read-only.
package verity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Partition names (GPT) and the device-mapper name of the opened root.
const (
	RootPartName   = "orrery-root"
	VerityPartName = "orrery-verity"
	MapperName     = "root"
)

// ErrMismatch means the root filesystem does not match the root hash.
var ErrMismatch = errors.New("dm-verity: root filesystem does not match the measured root hash")

// verityTool is what Open needs of veritysetup (internal/disk/cryptsetup.Tool).
type verityTool interface {
	OpenVerity(ctx context.Context, dataDev, name, hashDev, rootHash string) error
}

// MountFunc is unix.Mount's signature.
type MountFunc func(source, target, fstype string, flags uintptr, data string) error

// Root opens and mounts the root filesystem. Tool and Mount are required.
type Root struct {
	Tool  verityTool
	Mount MountFunc
	// MapperDir is where device-mapper devices appear; "" means /dev/mapper.
	MapperDir string
	// Probe, if set, is a file (relative to the mount point) read after
	// mounting, so that a tampered filesystem fails here and not later.
	// Reading it checks the blocks it occupies.
	Probe string
}

// Open maps dataDev with the hash tree on hashDev under rootHash (hex) and
// mounts it read-only (erofs) on target. An error that comes from data not
// matching the hash wraps ErrMismatch.
func (r *Root) Open(ctx context.Context, dataDev, hashDev, rootHash, target string) error {
	if err := r.Tool.OpenVerity(ctx, dataDev, MapperName, hashDev, rootHash); err != nil {
		// veritysetup checks the hash tree's top level against the root
		// hash; a failure here is a mismatch too.
		return fmt.Errorf("%w (%s with hash tree %s): %w", ErrMismatch, dataDev, hashDev, err)
	}
	mapperDir := r.MapperDir
	if mapperDir == "" {
		mapperDir = "/dev/mapper"
	}
	dev := filepath.Join(mapperDir, MapperName)
	if err := r.Mount(dev, target, "erofs", unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		if errors.Is(err, unix.EIO) || errors.Is(err, unix.EBADMSG) || errors.Is(err, unix.EUCLEAN) {
			return fmt.Errorf("%w: mount %s: %w", ErrMismatch, dev, err)
		}
		return fmt.Errorf("mount root filesystem %s on %s: %w", dev, target, err)
	}
	if r.Probe != "" {
		if _, err := os.ReadFile(filepath.Join(target, r.Probe)); err != nil {
			if errors.Is(err, unix.EIO) {
				return fmt.Errorf("%w: read /%s: %w", ErrMismatch, r.Probe, err)
			}
			return fmt.Errorf("root filesystem has no /%s: %w", r.Probe, err)
		}
	}
	return nil
}
