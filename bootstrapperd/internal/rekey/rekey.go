// Package rekey is bootstrapperd's view of the node's encrypted state
// disk: its LUKS UUID (the disk key is bound to it) and the one-time
// re-key from the random first-boot passphrase the initrd left in /run to
// the key derived from the cluster's master secret.
package rekey

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/orrery-dev/orrery/internal/disk/blockdev"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/owneraccess"
)

// ErrWrongVolume means the state disk is not the volume the initrd
// formatted at first boot, or not formatted the way Orrery formats it.
var ErrWrongVolume = errors.New("the state disk is not the volume this node formatted at first boot")

// LUKS is what the disk needs from cryptsetup.
type LUKS interface {
	UUID(ctx context.Context, dev string) (string, error)
	Inspect(ctx context.Context, dev string) (cryptsetup.Volume, error)
	AddKey(ctx context.Context, dev, keyFile, newKeyFile string) error
	RemoveKey(ctx context.Context, dev, keyFile string) error
	TestKey(ctx context.Context, dev, keyFile string) (bool, error)
	SetLabel(ctx context.Context, dev, label string) error
	SetSubsystem(ctx context.Context, dev, subsystem string) error
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
	// VolumeRecord is the initrd's record of the volume it formatted;
	// "" means handoff.VolumeRecordFile.
	VolumeRecord string
	// TmpDir holds the new key while cryptsetup reads it: a tmpfs.
	TmpDir string
	// Format is how the initrd formats state disks; the zero value means
	// cryptsetup.Authenticated.
	Format cryptsetup.Format
}

func (d *Disk) device() (string, error) {
	if d.Device != "" {
		return d.Device, nil
	}
	dev, err := blockdev.BySerial(d.Sysfs, handoff.Serial)
	if err != nil {
		return "", fmt.Errorf("find the state disk (virtio serial %q): %w", handoff.Serial, err)
	}
	return dev, nil
}

// UUID returns the state disk's LUKS UUID. Where the initrd recorded the
// volume it formatted, the disk must still be that volume
// (ErrWrongVolume): the disk key is bound to this UUID.
func (d *Disk) UUID(ctx context.Context) (string, error) {
	dev, err := d.device()
	if err != nil {
		return "", err
	}
	rec, err := d.record()
	if errors.Is(err, fs.ErrNotExist) {
		return d.LUKS.UUID(ctx, dev)
	}
	if err != nil {
		return "", err
	}
	if err := d.checkVolume(ctx, dev, rec); err != nil {
		return "", err
	}
	return rec.UUID, nil
}

func (d *Disk) record() (cryptsetup.Volume, error) {
	path := d.VolumeRecord
	if path == "" {
		path = handoff.VolumeRecordFile
	}
	return handoff.ReadVolumeRecord(path)
}

// checkVolume makes sure dev is the volume the initrd formatted (same UUID,
// cipher, key size and integrity) and that it was formatted as Orrery
// formats state blockdev. A disk swapped after the initrd ran, or a volume
// someone else prepared, fails with ErrWrongVolume.
func (d *Disk) checkVolume(ctx context.Context, dev string, rec cryptsetup.Volume) error {
	got, err := d.LUKS.Inspect(ctx, dev)
	if err != nil {
		return fmt.Errorf("read the state disk's LUKS header: %w", err)
	}
	if got != rec {
		return fmt.Errorf("%w: %s is %s (%s), the initrd formatted %s (%s); check which disk has serial %q, then reboot the node",
			ErrWrongVolume, dev, got.UUID, describe(got), rec.UUID, describe(rec), handoff.Serial)
	}
	want := d.Format
	if want == (cryptsetup.Format{}) {
		want = cryptsetup.Authenticated
	}
	if !want.Matches(got) {
		return fmt.Errorf("%w: %s uses %s, want %s", ErrWrongVolume, dev, describe(got), want)
	}
	return nil
}

func describe(v cryptsetup.Volume) string {
	return cryptsetup.Format{Cipher: v.Cipher, KeyBits: v.KeyBits, Integrity: v.Integrity}.String()
}

// Rekey makes newKey the disk's only key: it adds newKey, checks it opens
// the disk, removes the first-boot passphrase's keyslot and deletes the
// passphrase file. Interrupted at any point and run again with the same
// key, it finishes the job; once done, running it again is a no-op.
//
// While the first-boot passphrase is there, Rekey first checks that the
// disk is the volume the initrd recorded formatting (see checkVolume) and
// changes nothing otherwise: neither the disk nor the passphrase file,
// which still opens the node's real state volume.
func (d *Disk) Rekey(ctx context.Context, newKey []byte) error {
	dev, err := d.device()
	if err != nil {
		return err
	}
	if _, err := os.Stat(d.FirstBootKey); err == nil {
		rec, err := d.record()
		if err != nil {
			return fmt.Errorf("refusing to re-key the state disk: %w", err)
		}
		if err := d.checkVolume(ctx, dev, rec); err != nil {
			return fmt.Errorf("refusing to re-key the state disk: %w", err)
		}
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
	// Before the first-boot passphrase goes: from here on a reboot must
	// find the disk marked as a cluster's, never as one to reformat.
	if err := d.LUKS.SetLabel(ctx, dev, handoff.KeyedLabel); err != nil {
		return fmt.Errorf("mark the state disk as keyed to the cluster: %w", err)
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

// RecordOwner writes the owner's access key into the disk's LUKS2 header
// (owneraccess.HeaderField), where the initrd of a later boot finds it
// before the disk is open, to answer its owner while it waits for the
// disk's key.
func (d *Disk) RecordOwner(ctx context.Context, key ed25519.PublicKey) error {
	dev, err := d.device()
	if err != nil {
		return err
	}
	if err := d.LUKS.SetSubsystem(ctx, dev, owneraccess.HeaderField(key)); err != nil {
		return fmt.Errorf("record the owner's access key in the state disk's header: %w", err)
	}
	return nil
}
