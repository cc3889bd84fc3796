// Package unlock gets the key of an initialised state disk on a later
// boot, in the initrd: from the cluster's join service (a rejoin ticket,
// Rejoiner) or from the owner (orrery recover, RecoverServer), whichever
// comes first. Both hand their key to one Unlocker, which tries it on the
// disk and opens the disk with the first key that fits; a key that does
// not fit changes nothing.
package unlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
)

// Key is what opens the state disk and locks the node to its cluster.
type Key struct {
	DiskKey []byte
	// MeasurementSecret, with the measurement salt kept on the disk,
	// gives the cluster ID to extend PCR 15 with.
	MeasurementSecret []byte
	// From says who sent it, for the console.
	From string
}

var (
	// ErrWrongKey means a key does not open the state disk; the disk is
	// untouched.
	ErrWrongKey = errors.New("the key does not open this node's state disk")
	// ErrOpen means the disk was opened already, with an earlier key.
	ErrOpen = errors.New("the state disk is open already")
)

// LUKS is what the Unlocker needs of cryptsetup.
type LUKS interface {
	TestKey(ctx context.Context, dev, keyFile string) (bool, error)
	OpenLUKS(ctx context.Context, dev, name, keyFile string) error
}

// Unlocker opens the state disk with the first key that fits.
type Unlocker struct {
	LUKS LUKS
	// Device is the state disk, MapperName what it is opened as.
	Device, MapperName string
	// KeyDir holds a key file while cryptsetup reads it: a tmpfs.
	KeyDir string

	mu     sync.Mutex
	opened chan struct{}
	key    Key
}

func (u *Unlocker) openedChan() chan struct{} {
	if u.opened == nil {
		u.opened = make(chan struct{})
	}
	return u.opened
}

// Opened is closed once the disk is open.
func (u *Unlocker) Opened() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.openedChan()
}

// Key is the measurement secret and sender of the key that opened the
// disk (not the disk key itself); valid once Opened is closed.
func (u *Unlocker) Key() Key {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.key
}

// Try opens the disk with k. It returns ErrWrongKey, having changed
// nothing, if k does not open it, and ErrOpen if an earlier key did.
// Calls are serialised: two senders never open the disk twice.
func (u *Unlocker) Try(ctx context.Context, k Key) error {
	if len(k.DiskKey) == 0 || len(k.MeasurementSecret) != 32 {
		return fmt.Errorf("a key from %s with %d key bytes and a %d-byte measurement secret: want a key and 32 bytes", k.From, len(k.DiskKey), len(k.MeasurementSecret))
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.openedChan():
		return ErrOpen
	default:
	}
	f, err := os.CreateTemp(u.KeyDir, "state-key-")
	if err != nil {
		return fmt.Errorf("write the state disk key for cryptsetup: %w", err)
	}
	defer os.Remove(f.Name())
	_, werr := f.Write(k.DiskKey)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("write the state disk key for cryptsetup: %w", err)
	}
	// Tested before opening: cryptsetup open with a wrong key costs the
	// same, but a test keeps "wrong key" apart from "cannot open".
	ok, err := u.LUKS.TestKey(ctx, u.Device, f.Name())
	if err != nil {
		return fmt.Errorf("try the key on %s: %w", u.Device, err)
	}
	if !ok {
		return ErrWrongKey
	}
	if err := u.LUKS.OpenLUKS(ctx, u.Device, u.MapperName, f.Name()); err != nil {
		return fmt.Errorf("open %s: %w", u.Device, err)
	}
	// The disk key is not kept: the kernel holds the volume key now.
	u.key = Key{MeasurementSecret: bytes.Clone(k.MeasurementSecret), From: k.From}
	close(u.opened)
	return nil
}
