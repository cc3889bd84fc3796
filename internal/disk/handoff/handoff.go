// Package handoff is what the initrd hands bootstrapperd about the
// node's state disk on first boot, and the one place both sides read its
// terms from: which disk is the state disk (its serial), where the random
// passphrase it was formatted with lies, and the record of the volume it
// formatted, so that bootstrapperd re-keys that volume and no other. The
// files live on /run and vanish with the boot.
package handoff

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
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

// The state disk's LUKS2 label tells a later boot whether the disk ever
// belonged to a cluster. The initrd formats it with FirstBootLabel and a
// random passphrase that lives only in /run; bootstrapperd sets KeyedLabel
// once the cluster's key is in a keyslot. A disk that still has
// FirstBootLabel at a later boot was never keyed to a cluster: its only
// key was lost with the earlier boot's /run, nothing on it can be read,
// and the initrd prepares it afresh. Any other label means the disk may
// hold a cluster's data, and it is never reformatted. (The header is not
// authenticated; a host that rewrites the label can make the node lose a
// disk it could destroy anyway, and learns nothing.)
const (
	FirstBootLabel = "orrery-state"
	KeyedLabel     = "orrery-state-keyed"
)
