package handoff

import (
	"fmt"
	"os"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/keys"
)

// MeasurementSaltFile is where a node keeps its cluster's measurement
// salt, on the state disk (in the OS; the initrd finds it under its
// sysroot). bootstrapperd writes it when the node joins or initialises a
// cluster; the initrd of every later boot reads it to compute the cluster
// ID again, with the measurement secret a rejoin or recovery gives it. The
// salt is not secret, but a wrong one would lock the node to a cluster ID
// no one else has.
const MeasurementSaltFile = StateDir + "/" + MeasurementSaltName

// StateDir is bootstrapperd's directory on the state disk, and
// MeasurementSaltName the salt's file in it.
const (
	StateDir            = "/var/lib/orrery"
	MeasurementSaltName = "measurement-salt"
)

// WriteMeasurementSalt replaces path with salt, atomically.
func WriteMeasurementSalt(path string, salt []byte) error {
	if len(salt) != keys.SaltSize {
		return fmt.Errorf("record the measurement salt: %d bytes, want %d", len(salt), keys.SaltSize)
	}
	if err := atomicfile.WriteFile(path, salt, 0o600); err != nil {
		return fmt.Errorf("record the measurement salt: %w", err)
	}
	return nil
}

// ReadMeasurementSalt reads the salt WriteMeasurementSalt wrote.
func ReadMeasurementSalt(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the cluster's measurement salt: %w", err)
	}
	if len(b) != keys.SaltSize {
		return nil, fmt.Errorf("read the cluster's measurement salt: %s has %d bytes, want %d (the file is damaged)", path, len(b), keys.SaltSize)
	}
	return b, nil
}
