// Package diskimage writes a node's GPT disk image: an EFI system partition
// and the verity-protected root with its hash partition, each copied from a
// file, at 1 MiB aligned offsets. The output depends only on the inputs:
// the disk's and partitions' GUIDs are given (see GUID for deriving them
// from content), never random.
package diskimage

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/gpt"
)

// Partition type GUIDs (UEFI spec; Discoverable Partitions Specification).
const (
	TypeESP             = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	TypeRootX86_64      = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
	TypeRootVerityX8664 = "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5"
)

const (
	sectorSize = 512
	align      = 1 << 20
)

// Partition is one partition of the disk, in order.
type Partition struct {
	// Name is the GPT partition name (how the initrd finds it).
	Name string
	// Type and GUID are the partition type and unique GUIDs.
	Type, GUID string
	// Contents is the file copied into the partition; the partition is its
	// size rounded up to 1 MiB.
	Contents string
}

// Spec describes a disk image.
type Spec struct {
	// GUID is the disk GUID.
	GUID       string
	Partitions []Partition
	// SizeMultiple, if set, rounds the disk's size up to a multiple of
	// it, as free space after the last partition: GCE imports only raw
	// disks whose size is a whole number of GiB.
	SizeMultiple int64
}

// Write creates the disk image at path (replacing a file there).
func Write(path string, spec Spec) error {
	if spec.GUID == "" || len(spec.Partitions) == 0 {
		return errors.New("disk image: a disk GUID and at least one partition are required")
	}
	type placed struct {
		Partition
		size int64
	}
	var parts []placed
	// GPT header and entries fit in the first MiB; the backup in the last.
	total := int64(align)
	for _, p := range spec.Partitions {
		if p.GUID == "" || p.Type == "" || p.Name == "" {
			return fmt.Errorf("disk image: partition %q needs a name, a type and a GUID", p.Name)
		}
		fi, err := os.Stat(p.Contents)
		if err != nil {
			return fmt.Errorf("disk image: partition %s: %w", p.Name, err)
		}
		size := (fi.Size() + align - 1) / align * align
		if size == 0 {
			size = align
		}
		parts = append(parts, placed{p, size})
		total += size
	}
	total += align
	if m := spec.SizeMultiple; m > 0 {
		if m%sectorSize != 0 {
			return fmt.Errorf("disk image: size multiple %d is not a whole number of %d-byte sectors", m, sectorSize)
		}
		total = (total + m - 1) / m * m
	}

	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disk image: %w", err)
	}
	d, err := diskfs.Create(path, total, diskfs.SectorSize512)
	if err != nil {
		return fmt.Errorf("disk image: create %s: %w", path, err)
	}
	defer d.Close()
	table := &gpt.Table{
		LogicalSectorSize:  sectorSize,
		PhysicalSectorSize: sectorSize,
		GUID:               spec.GUID,
		ProtectiveMBR:      true,
	}
	start := uint64(align / sectorSize)
	for i, p := range parts {
		sectors := uint64(p.size / sectorSize)
		table.Partitions = append(table.Partitions, &gpt.Partition{
			Index: i + 1,
			Start: start,
			End:   start + sectors - 1,
			Type:  gpt.Type(p.Type),
			Name:  p.Name,
			GUID:  p.GUID,
		})
		start += sectors
	}
	if err := d.Partition(table); err != nil {
		return fmt.Errorf("disk image: write partition table: %w", err)
	}
	for i, p := range parts {
		if err := copyInto(d.WritePartitionContents, i+1, p.Contents, p.size); err != nil {
			return fmt.Errorf("disk image: partition %s: %w", p.Name, err)
		}
	}
	return nil
}

// copyInto writes the file at path into partition index, padded with zeros
// to the partition's size.
func copyInto(write func(int, io.Reader) (int64, error), index int, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	r := bufio.NewReaderSize(io.MultiReader(f, io.LimitReader(zeros{}, size-fi.Size())), 1<<20)
	_, err = write(index, r)
	return err
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// GUID derives a GUID from seed and purpose: a version 4 (random-format)
// GUID whose bits come from SHA-256(purpose || 0 || seed), so the same
// content gives the same GUID and different purposes different ones.
func GUID(seed []byte, purpose string) string {
	h := sha256.New()
	h.Write([]byte(purpose))
	h.Write([]byte{0})
	h.Write(seed)
	b := h.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%X-%X-%X-%X-%X", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
