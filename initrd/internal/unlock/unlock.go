// Package unlock gets the key of an initialised state disk on a later
// boot, in the initrd: from the cluster's join service (a rejoin ticket,
// Rejoiner) or from the owner (orrery recover, RecoverServer), whichever
// comes first. Both hand their key to one Unlocker, which tries it on the
// disk and opens the disk with the first key that fits; a key that does
// not fit changes nothing.
//
// The host controls the disk and its LUKS2 header, which nothing
// authenticates: the right key still opens a header rewritten to map the
// host's plaintext. So before any key is tried the Unlocker copies the
// header and checks the copy is exactly what Orrery formats
// (cryptsetup.StateDisk), then tries keys and opens the disk with that
// copy only, and checks the kernel's mapping once open.
package unlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
)

// Key is what opens the state disk and locks the node to its cluster.
type Key struct {
	DiskKey []byte
	// MeasurementSecret, with the measurement salt kept on the disk,
	// gives the cluster ID to extend PCR 15 with.
	MeasurementSecret []byte
	// Cluster is what the cluster's join service (a rejoin ticket,
	// checked by the Rejoiner) or the owner (a recovery, checked by the
	// RecoverServer) says of it, to check the Kubernetes files kept on
	// the disk against. Callers must handle nil, and trust a disk key
	// that comes without it with nothing the disk keeps.
	Cluster *Cluster
	// OwnerAccessKey is the public half of the owner's access key, for
	// the inspect service: from the join service's ticket, or derived from
	// the owner's master secret; nil if a ticket carried none.
	OwnerAccessKey []byte
	// From says who sent it, for the console.
	From string
	// JoinService is the address of the join service whose rejoin
	// ticket carried the key, which the node then tells its disk's
	// generation (initrd/internal/diskgen); empty when the owner's
	// recovery sent the key.
	JoinService string
}

// Cluster is what a rejoin ticket or the owner's recovery says of the
// node's cluster. It comes with the key that opens the disk, over
// attested TLS, so the initrd trusts it over anything the host serves.
type Cluster struct {
	// CACert is the cluster CA's certificate, DER; a CA certificate.
	CACert []byte
	// Endpoint is the Kubernetes API server, host:port (an IPv6 host in
	// brackets).
	Endpoint string
	// ControlPlane is true if the owner approved this node's instance
	// as a control plane (the join service's word), or recovered it (the
	// owner's own); the node's metadata role, the host's word, does not
	// count.
	ControlPlane bool
	// KubernetesVersion is the version the cluster runs now, one this
	// image carries: the join service's word. "" from a recovery: the
	// recovered control plane runs what its checked static pods name.
	KubernetesVersion string
}

func (c *Cluster) clone() *Cluster {
	if c == nil {
		return nil
	}
	return &Cluster{CACert: bytes.Clone(c.CACert), Endpoint: c.Endpoint, ControlPlane: c.ControlPlane, KubernetesVersion: c.KubernetesVersion}
}

var (
	// ErrWrongKey means a key does not open the state disk; the disk is
	// untouched.
	ErrWrongKey = errors.New("the key does not open this node's state disk")
	// ErrOpen means the disk was opened already, with an earlier key.
	ErrOpen = errors.New("the state disk is open already")
	// ErrRefused means the disk's LUKS2 header, or the mapping it made,
	// is not what Orrery formats: no key is tried on it, ever again in
	// this boot.
	ErrRefused = errors.New("refusing the state disk: it is not formatted as Orrery formats it")
)

// LUKS is what the Unlocker needs of cryptsetup (a *cryptsetup.Tool).
type LUKS interface {
	SaveHeader(ctx context.Context, dev, path string, h cryptsetup.Header) (cryptsetup.Volume, error)
	TestKeyWithHeader(ctx context.Context, dev, header, keyFile string) (bool, error)
	OpenChecked(ctx context.Context, dev, header, name, keyFile string, h cryptsetup.Header) error
}

// Unlocker opens the state disk with the first key that fits.
type Unlocker struct {
	LUKS LUKS
	// Device is the state disk, MapperName what it is opened as.
	Device, MapperName string
	// KeyDir holds a key file while cryptsetup reads it, and the copy of
	// the disk's header keys are tried with: a tmpfs.
	KeyDir string
	// Header is the LUKS2 header the disk must have; the zero value
	// means cryptsetup.StateDisk.
	Header cryptsetup.Header

	mu     sync.Mutex
	opened chan struct{}
	key    Key
	// header is the checked copy of the disk's header; refused, why the
	// disk was refused.
	header  string
	refused error
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

// Key is the measurement secret, cluster and sender of the key that
// opened the disk (not the disk key itself); valid once Opened is closed.
func (u *Unlocker) Key() Key {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.key
}

func (u *Unlocker) spec() cryptsetup.Header {
	if u.Header == (cryptsetup.Header{}) {
		return cryptsetup.StateDisk
	}
	return u.Header
}

// Check makes sure the disk can take a key: it copies the disk's LUKS2
// header to KeyDir and checks the copy (cryptsetup.Tool.SaveHeader),
// once; every key is then tried with that copy. A header that is not
// what Orrery formats fails with ErrRefused (wrapping the
// *cryptsetup.FormatError that names the field), now and at every later
// call. Try checks too; a sender checks first so as not to ask for a
// key the disk would not take.
func (u *Unlocker) Check(ctx context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, err := u.checkedHeader(ctx)
	return err
}

func (u *Unlocker) checkedHeader(ctx context.Context) (string, error) {
	if u.refused != nil {
		return "", u.refused
	}
	if u.header != "" {
		return u.header, nil
	}
	path := filepath.Join(u.KeyDir, "state-header")
	if _, err := u.LUKS.SaveHeader(ctx, u.Device, path, u.spec()); err != nil {
		return "", u.refuse(err)
	}
	u.header = path
	return path, nil
}

// refuse makes err, if it says the disk is not what Orrery formats,
// final: ErrRefused for every later key.
func (u *Unlocker) refuse(err error) error {
	var fe *cryptsetup.FormatError
	if errors.As(err, &fe) {
		u.refused = fmt.Errorf("%w: %w", ErrRefused, err)
		return u.refused
	}
	return fmt.Errorf("check the state disk's header: %w", err)
}

// Try opens the disk with k. It returns ErrWrongKey, having changed
// nothing, if k does not open it, ErrOpen if an earlier key did, and
// ErrRefused, without trying k, if the disk is not what Orrery formats
// (see Check). Calls are serialised: two senders never open the disk
// twice.
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
	header, err := u.checkedHeader(ctx)
	if err != nil {
		return err
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
	ok, err := u.LUKS.TestKeyWithHeader(ctx, u.Device, header, f.Name())
	if err != nil {
		return fmt.Errorf("try the key on %s: %w", u.Device, err)
	}
	if !ok {
		return ErrWrongKey
	}
	if err := u.LUKS.OpenChecked(ctx, u.Device, header, u.MapperName, f.Name(), u.spec()); err != nil {
		var fe *cryptsetup.FormatError
		if errors.As(err, &fe) {
			return u.refuse(err)
		}
		return fmt.Errorf("open %s: %w", u.Device, err)
	}
	// The kernel holds the volume key now; the copy of the header is
	// no longer needed, and the disk key is not kept.
	os.Remove(header)
	u.key = Key{MeasurementSecret: bytes.Clone(k.MeasurementSecret), Cluster: k.Cluster.clone(), OwnerAccessKey: bytes.Clone(k.OwnerAccessKey), From: k.From, JoinService: k.JoinService}
	close(u.opened)
	return nil
}
