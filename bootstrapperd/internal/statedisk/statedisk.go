// Package statedisk is bootstrapperd's view of the node's encrypted state
// disk: its LUKS UUID (the disk key is bound to it) and the one-time
// re-key from the random first-boot passphrase the initrd left in /run to
// the key derived from the cluster's master secret.
package statedisk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/orrery-dev/orrery/internal/disks"
)

// Serial is the virtio serial of the state disk.
const Serial = "state"

// DefaultFirstBootKey is where the initrd leaves the first-boot passphrase.
const DefaultFirstBootKey = "/run/orrery/first-boot-key"

// LUKS is what the disk needs from cryptsetup.
type LUKS interface {
	UUID(ctx context.Context, dev string) (string, error)
	AddKey(ctx context.Context, dev, keyFile, newKeyFile string) error
	RemoveKey(ctx context.Context, dev, keyFile string) error
	TestKey(ctx context.Context, dev, keyFile string) (bool, error)
}

// Disk is the node's state disk.
type Disk struct {
	LUKS LUKS
	// Device is the block device; empty means the disk with Serial found
	// in Sysfs.
	Device string
	Sysfs  string
	// FirstBootKey is the first-boot passphrase file.
	FirstBootKey string
	// TmpDir holds the new key while cryptsetup reads it: a tmpfs.
	TmpDir string
}

func (d *Disk) device() (string, error) {
	if d.Device != "" {
		return d.Device, nil
	}
	dev, err := disks.BySerial(d.Sysfs, Serial)
	if err != nil {
		return "", fmt.Errorf("find the state disk (virtio serial %q): %w", Serial, err)
	}
	return dev, nil
}

// UUID returns the state disk's LUKS UUID.
func (d *Disk) UUID(ctx context.Context) (string, error) {
	dev, err := d.device()
	if err != nil {
		return "", err
	}
	return d.LUKS.UUID(ctx, dev)
}

// Rekey makes newKey the disk's only key: it adds newKey, checks it opens
// the disk, removes the first-boot passphrase's keyslot and deletes the
// passphrase file. Interrupted at any point and run again with the same
// key, it finishes the job; once done, running it again is a no-op.
func (d *Disk) Rekey(ctx context.Context, newKey []byte) error {
	dev, err := d.device()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.TmpDir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(d.TmpDir, "disk-key-")
	if err != nil {
		return fmt.Errorf("stage the new disk key: %w", err)
	}
	newKeyFile := f.Name()
	defer os.Remove(newKeyFile)
	if _, err := f.Write(newKey); err != nil {
		f.Close()
		return fmt.Errorf("stage the new disk key: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}

	haveNew, err := d.LUKS.TestKey(ctx, dev, newKeyFile)
	if err != nil {
		return fmt.Errorf("test the new disk key: %w", err)
	}
	if _, err := os.Stat(d.FirstBootKey); errors.Is(err, fs.ErrNotExist) {
		if haveNew {
			return nil // already re-keyed
		}
		return errors.New("the first-boot passphrase is gone and the derived key does not open the state disk: the disk belongs to another cluster")
	}
	if !haveNew {
		if err := d.LUKS.AddKey(ctx, dev, d.FirstBootKey, newKeyFile); err != nil {
			return fmt.Errorf("add the derived key: %w", err)
		}
		if ok, err := d.LUKS.TestKey(ctx, dev, newKeyFile); err != nil || !ok {
			return fmt.Errorf("the derived key does not open the state disk after adding it (%v)", err)
		}
	}
	if ok, err := d.LUKS.TestKey(ctx, dev, d.FirstBootKey); err != nil {
		return fmt.Errorf("test the first-boot passphrase: %w", err)
	} else if ok {
		if err := d.LUKS.RemoveKey(ctx, dev, d.FirstBootKey); err != nil {
			return fmt.Errorf("remove the first-boot passphrase: %w", err)
		}
	}
	if err := os.Remove(d.FirstBootKey); err != nil {
		return fmt.Errorf("delete the first-boot passphrase file: %w", err)
	}
	return nil
}
