// Package statedisk prepares the node's state disk in the initrd: the one
// writable disk, encrypted with LUKS2, that holds everything the node
// keeps across reboots: its data, on /var, and nothing the OS runs (see
// Layout).
//
// On first boot the disk is blank: Prepare formats it with a random
// passphrase, which it leaves in KeyFile for the bootstrapper (which later
// re-keys the disk to a key derived from the cluster's master secret),
// and records in VolumeRecord which volume it formatted, so that the
// bootstrapper re-keys that volume and no other.
// A disk that is already LUKS belongs to a node that must rejoin its
// cluster or be recovered: Prepare returns ErrInitialised and touches
// nothing.
//
// The host controls the disk, and nothing authenticates a LUKS2 header:
// a header rewritten to cipher_null still opens with the right key and
// maps the host's plaintext. So Prepare refuses a LUKS disk whose header
// is not exactly what the initrd formats (cryptsetup.StateDisk) before
// any key is asked for, and never treats it as blank; and it opens the
// disk it formatted with a checked copy of the header, then checks the
// kernel's mapping.
package statedisk

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
)

// Defaults for Preparer's fields.
const (
	DefaultSysroot = "/sysroot"
	MapperName     = "state"
	// Label is the ext4 label of the state disk, and the LUKS2 label
	// until the disk is keyed to a cluster (handoff.FirstBootLabel).
	Label = handoff.FirstBootLabel
)

// blankCheckSize is how much of a disk must be zero for it to count as
// blank: a LUKS header or any filesystem signature lies within it.
const blankCheckSize = 1 << 20

// ErrInitialised means the state disk is already a LUKS volume.
var ErrInitialised = errors.New("state disk is initialised")

// luksTool is what Prepare needs of cryptsetup (internal/disk/cryptsetup.Tool).
type luksTool interface {
	IsLUKS(ctx context.Context, dev string) (bool, error)
	CheckHeader(ctx context.Context, dev string, h cryptsetup.Header) (cryptsetup.Volume, error)
	Label(ctx context.Context, dev string) (string, error)
	FormatLUKS2(ctx context.Context, dev, keyFile string, o cryptsetup.FormatOpts) error
	SaveHeader(ctx context.Context, dev, path string, h cryptsetup.Header) (cryptsetup.Volume, error)
	OpenChecked(ctx context.Context, dev, header, name, keyFile string, h cryptsetup.Header) error
}

// mkfsTool makes the filesystem on the opened volume (E2fs).
type mkfsTool interface {
	MakeExt4(ctx context.Context, dev, label string) error
}

// MountFunc is unix.Mount's signature.
type MountFunc func(source, target, fstype string, flags uintptr, data string) error

// Preparer prepares the state disk. LUKS, Mkfs and Mount are required.
type Preparer struct {
	LUKS  luksTool
	Mkfs  mkfsTool
	Mount MountFunc
	// Rand is the source of the passphrase; nil means crypto/rand.
	Rand io.Reader
	// KeyFile receives the first-boot passphrase (32 raw bytes, mode
	// 0400); "" means handoff.KeyFile. It must be on a tmpfs.
	KeyFile string
	// VolumeRecord receives the UUID, cipher and key size of the volume
	// Prepare formatted (a cryptsetup.Volume as JSON); "" means
	// handoff.VolumeRecordFile. It must be on a tmpfs beside KeyFile.
	VolumeRecord string
	// Sysroot is where the root filesystem is mounted; "" means
	// DefaultSysroot. See Layout for what is mounted there.
	Sysroot string
	// RunDir is the tmpfs that moves into the OS; "" means /run. The
	// writable layer of /etc is a tmpfs below it.
	RunDir string
	// MapperDir is where device-mapper devices appear; "" means /dev/mapper.
	MapperDir string
	// Header is the LUKS2 header Prepare formats and accepts; the zero
	// value means cryptsetup.StateDisk.
	Header cryptsetup.Header
}

func (p *Preparer) spec() cryptsetup.Header {
	if p.Header == (cryptsetup.Header{}) {
		return cryptsetup.StateDisk
	}
	return p.Header
}

// ErrRefused means the state disk is a LUKS volume whose header is not
// what the initrd formats: no key may be tried on it, and it is not
// blank either.
var ErrRefused = errors.New("refusing the state disk")

// Result tells what Prepare did.
type Result struct {
	Device     string        // the opened volume, /dev/mapper/state
	FormatTime time.Duration // spent in luksFormat
	MkfsTime   time.Duration // spent in mke2fs
	OpenTime   time.Duration // spent opening the volume
	// Abandoned means the disk was a LUKS volume an earlier first boot
	// formatted and nobody keyed to a cluster; it was prepared afresh.
	Abandoned bool
}

// Prepare sets up the blank state disk dev on first boot. It returns
// ErrInitialised, having changed nothing, if dev is a LUKS volume that
// may belong to a cluster; ErrRefused, having changed nothing, if dev is
// a LUKS volume whose header is not exactly what the initrd formats
// (Header: the error names the field that differs); and an error without
// touching dev if dev is neither LUKS nor blank. A LUKS volume an earlier
// first boot formatted and nobody keyed to a cluster (see
// handoff.FirstBootLabel) is prepared afresh, and Result.Abandoned
// says so.
func (p *Preparer) Prepare(ctx context.Context, dev string) (Result, error) {
	var res Result
	abandoned, err := p.reclaim(ctx, dev)
	if err != nil {
		return res, err
	}
	res.Abandoned = abandoned
	keyFile := p.KeyFile
	if keyFile == "" {
		keyFile = handoff.KeyFile
	}
	if err := writeKey(keyFile, p.Rand); err != nil {
		return res, err
	}
	start := time.Now()
	uuid, err := p.format(ctx, dev, keyFile)
	if err != nil {
		return res, err
	}
	res.FormatTime = time.Since(start)
	start = time.Now()
	if res.Device, err = p.openFormatted(ctx, dev, keyFile, uuid); err != nil {
		return res, err
	}
	res.OpenTime = time.Since(start)
	start = time.Now()
	if err := p.Mkfs.MakeExt4(ctx, res.Device, Label); err != nil {
		return res, fmt.Errorf("create filesystem on state disk: %w", err)
	}
	res.MkfsTime = time.Since(start)
	return res, p.MountState(res.Device)
}

// reclaim makes sure dev may be formatted: it is blank, or holds a
// first boot's volume that never got a cluster's key (abandoned, its
// header erased). A disk that is initialised is ErrInitialised; one whose
// header is not Orrery's, or that holds other data, is refused.
func (p *Preparer) reclaim(ctx context.Context, dev string) (abandoned bool, err error) {
	isLUKS, err := p.LUKS.IsLUKS(ctx, dev)
	if err != nil {
		return false, fmt.Errorf("check for a LUKS header on %s: %w", dev, err)
	}
	if isLUKS {
		if _, err := p.LUKS.CheckHeader(ctx, dev, p.spec()); err != nil {
			return false, fmt.Errorf("%w: %w. No key was asked for or tried, and the disk is left as it is: "+
				"whoever controls the node's disks changed it, or it is not a disk Orrery formatted. "+
				"Replace it with a blank disk (serial %q) to join the node as a new node",
				ErrRefused, err, handoff.Serial)
		}
		label, err := p.LUKS.Label(ctx, dev)
		if err != nil {
			return false, fmt.Errorf("read the LUKS label of %s: %w", dev, err)
		}
		if label != handoff.FirstBootLabel {
			return false, ErrInitialised
		}
		if err := eraseHeader(dev); err != nil {
			return false, err
		}
		abandoned = true
	}
	blank, err := IsBlank(dev)
	if err != nil {
		return abandoned, err
	}
	if !blank {
		return abandoned, fmt.Errorf("%s is neither blank nor a LUKS volume: refusing to format a disk that holds data; attach a blank disk with serial %q", dev, handoff.Serial)
	}
	return abandoned, nil
}

// format formats dev for the passphrase in keyFile under a fresh UUID,
// which it returns, and records the volume for bootstrapperd.
func (p *Preparer) format(ctx context.Context, dev, keyFile string) (string, error) {
	// The passphrase is 32 bytes from crypto/rand: guessing it is out of
	// reach whatever the key derivation costs, so a slow, memory-hard
	// PBKDF would only cost boot time (minutes under emulation). PBKDF2
	// with the minimum iteration count is enough. The bootstrapper
	// re-keys the disk to a derived key later.
	uuid, err := newUUID(p.Rand)
	if err != nil {
		return "", err
	}
	spec := p.spec()
	opts := spec.FormatOpts()
	opts.Label, opts.UUID = Label, uuid
	if err := p.LUKS.FormatLUKS2(ctx, dev, keyFile, opts); err != nil {
		return "", fmt.Errorf("format state disk: %w", err)
	}
	record := p.VolumeRecord
	if record == "" {
		record = handoff.VolumeRecordFile
	}
	if err := handoff.WriteVolumeRecord(record, spec.Format.Volume(uuid)); err != nil {
		return "", err
	}
	return uuid, nil
}

// openFormatted opens the volume format made on dev and returns its
// mapped device. The header is read back from the disk, which the host
// could have rewritten since: the copy must be the volume just formatted,
// and the disk is opened with that copy.
func (p *Preparer) openFormatted(ctx context.Context, dev, keyFile, uuid string) (string, error) {
	spec := p.spec()
	header := filepath.Join(filepath.Dir(keyFile), "state-header")
	vol, err := p.LUKS.SaveHeader(ctx, dev, header, spec)
	if err != nil {
		return "", fmt.Errorf("read back the state disk's new header: %w", err)
	}
	defer os.Remove(header)
	if vol.UUID != uuid {
		return "", fmt.Errorf("read back the state disk's new header: its UUID is %s, the initrd formatted %s: something else rewrote the disk", vol.UUID, uuid)
	}
	if err := p.LUKS.OpenChecked(ctx, dev, header, MapperName, keyFile, spec); err != nil {
		return "", fmt.Errorf("open state disk: %w", err)
	}
	mapperDir := p.MapperDir
	if mapperDir == "" {
		mapperDir = "/dev/mapper"
	}
	return filepath.Join(mapperDir, MapperName), nil
}

// headerSize covers the LUKS2 headers (both copies and the keyslot area:
// 16 MiB as cryptsetup formats by default) and the dm-integrity superblock
// after them.
const headerSize = 32 << 20

// eraseHeader zeroes the start of a never-keyed volume, whose key is lost,
// so that it is blank again.
func eraseHeader(dev string) error {
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("erase the abandoned state disk: %w", err)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = f.WriteAt(make([]byte, min(size, headerSize)), 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("erase the abandoned state disk: %w", err)
	}
	return nil
}

// IsBlank reports whether the first MiB of dev (or all of it, if smaller)
// is zero.
func IsBlank(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, fmt.Errorf("open state disk: %w", err)
	}
	defer f.Close()
	buf := make([]byte, blankCheckSize)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read state disk %s: %w", dev, err)
	}
	return n > 0 && bytes.Count(buf[:n], []byte{0}) == n, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID(r io.Reader) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	var b [16]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return "", fmt.Errorf("generate state disk UUID: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]), nil
}

// writeKey writes a new random 32-byte passphrase to path, readable by
// root only. It refuses to overwrite an existing file.
func writeKey(path string, r io.Reader) error {
	if r == nil {
		r = rand.Reader
	}
	key := make([]byte, 32)
	if _, err := io.ReadFull(r, key); err != nil {
		return fmt.Errorf("generate state disk passphrase: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create directory for the state disk passphrase: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return fmt.Errorf("write state disk passphrase: %w", err)
	}
	_, err = f.Write(key)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write state disk passphrase: %w", err)
	}
	return nil
}
