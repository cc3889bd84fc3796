package pcrpredict

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Firmware strings OVMF measures into PCR 5 around ExitBootServices.
const (
	ExitBootServicesInvocation = "Exit Boot Services Invocation"
	ExitBootServicesSucceeded  = "Exit Boot Services Returned with Success"
)

// sectorSize is the logical sector size of the images (and of virtio-blk).
const sectorSize = 512

// PCR5 returns OVMF's PCR 5 events for a boot from disk: the EV_SEPARATOR,
// the EV_EFI_GPT_EVENT of the boot disk's partition table, and the two
// EV_EFI_ACTIONs of the boot loader calling ExitBootServices. disk is the
// raw disk image.
func PCR5(disk io.ReaderAt) ([]Event, error) {
	gpt, err := GPTEventData(disk)
	if err != nil {
		return nil, err
	}
	return []Event{
		Measure(5, separatorData, "EV_SEPARATOR"),
		Measure(5, gpt, "EV_EFI_GPT_EVENT"),
		Measure(5, []byte(ExitBootServicesInvocation), "EV_EFI_ACTION "+ExitBootServicesInvocation),
		Measure(5, []byte(ExitBootServicesSucceeded), "EV_EFI_ACTION "+ExitBootServicesSucceeded),
	}, nil
}

// GPTEventData returns the UEFI_GPT_DATA the firmware measures for a disk
// (TCG PC Client Platform Firmware Profile, EV_EFI_GPT_EVENT): the primary
// GPT header (HeaderSize bytes, as on disk), the number of used partition
// entries as a 64-bit count, then those entries in table order.
func GPTEventData(disk io.ReaderAt) ([]byte, error) {
	hdr := make([]byte, sectorSize)
	if _, err := disk.ReadAt(hdr, sectorSize); err != nil {
		return nil, fmt.Errorf("read the GPT header: %w", err)
	}
	if !bytes.Equal(hdr[:8], []byte("EFI PART")) {
		return nil, errors.New("no GPT header at LBA 1 (512-byte sectors)")
	}
	le := binary.LittleEndian
	headerSize := le.Uint32(hdr[12:])
	entriesLBA := le.Uint64(hdr[72:])
	count := le.Uint32(hdr[80:])
	entrySize := le.Uint32(hdr[84:])
	switch {
	case headerSize < 92 || headerSize > sectorSize:
		return nil, fmt.Errorf("GPT header size %d out of range", headerSize)
	case entrySize < 128 || entrySize > 4096 || entrySize%8 != 0:
		return nil, fmt.Errorf("GPT partition entry size %d out of range", entrySize)
	case count == 0 || count > 1024:
		return nil, fmt.Errorf("GPT lists %d partition entries; want 1 to 1024", count)
	case entriesLBA < 2 || entriesLBA > 1<<40:
		return nil, fmt.Errorf("GPT partition entries at LBA %d", entriesLBA)
	}
	table := make([]byte, int(count)*int(entrySize))
	if _, err := disk.ReadAt(table, int64(entriesLBA)*sectorSize); err != nil {
		return nil, fmt.Errorf("read the GPT partition entries: %w", err)
	}
	var used [][]byte
	for i := 0; i < int(count); i++ {
		e := table[i*int(entrySize) : (i+1)*int(entrySize)]
		if !bytes.Equal(e[:16], make([]byte, 16)) { // an unused entry has a zero type GUID
			used = append(used, e)
		}
	}
	out := append([]byte{}, hdr[:headerSize]...)
	out = le.AppendUint64(out, uint64(len(used)))
	for _, e := range used {
		out = append(out, e...)
	}
	return out, nil
}
