// Package diskhandoff is what the initrd hands bootstrapperd about the
// node's state disk on first boot, and the one place both sides read its
// terms from: which disk is the state disk (its serial), where the random
// passphrase it was formatted with lies, and the record of the volume it
// formatted, so that bootstrapperd re-keys that volume and no other. The
// files live on /run and vanish with the boot.
package diskhandoff

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/orrery-dev/orrery/internal/cryptsetup"
)

// Serial is the state disk's serial (/sys/block/<dev>/serial): the
// platform attaches the disk with it.
const Serial = "state"

// Where the initrd leaves the hand-off on a node.
const (
	// KeyFile holds the first-boot passphrase.
	KeyFile = "/run/orrery/first-boot-key"
	// VolumeRecordFile holds the formatted volume's cryptsetup.Volume
	// as JSON.
	VolumeRecordFile = "/run/orrery/first-boot-volume.json"
)

// WriteVolumeRecord records which volume the initrd formatted, readable by
// root only. Like the passphrase, it is written once: an existing file is
// an error, never overwritten.
func WriteVolumeRecord(path string, v cryptsetup.Volume) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return fmt.Errorf("record the formatted state disk: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("record the formatted state disk: %w", err)
	}
	return nil
}

// ReadVolumeRecord reads the initrd's record of the volume it formatted.
func ReadVolumeRecord(path string) (cryptsetup.Volume, error) {
	var v cryptsetup.Volume
	b, err := os.ReadFile(path)
	if err != nil {
		return v, fmt.Errorf("read the initrd's record of the state disk: %w", err)
	}
	if err := json.Unmarshal(b, &v); err != nil || v.UUID == "" {
		return cryptsetup.Volume{}, fmt.Errorf("the initrd's record of the state disk (%s) is damaged: reboot the node before it joins a cluster", path)
	}
	return v, nil
}
