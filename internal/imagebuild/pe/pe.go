// Package pe computes the Authenticode digest of a PE/COFF image, the hash
// UEFI firmware extends into PCR 4 for every EFI application it loads.
//
// The digest follows the PE/COFF specification's "Calculating the PE Image
// Hash" (and EDK2's DxeTpm2MeasureBootLib, which implements it for
// measured boot): the headers without the CheckSum field and without the
// Certificate Table data directory entry, then every section's raw data in
// order of file offset, then whatever follows the bytes hashed so far, up
// to the attribute certificate table.
package pe

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sort"
)

const (
	magicPE32     = 0x10b
	magicPE32Plus = 0x20b
	// securityDir is the index of the Certificate Table data directory.
	securityDir = 4
	// sectionHeaderSize is the size of one entry of the section table.
	sectionHeaderSize = 40
)

// Headers are the offsets into a PE image that hashing and assembling need.
type Headers struct {
	// COFF is the offset of the COFF file header (after "PE\0\0").
	COFF int
	// Optional is the offset of the optional header, OptionalSize its size.
	Optional, OptionalSize int
	// PE32Plus is true for 64-bit images.
	PE32Plus bool
	// CheckSum is the offset of the optional header's CheckSum field.
	CheckSum int
	// DataDirs is the offset of the data directories, NumDataDirs their count.
	DataDirs, NumDataDirs int
	// SectionTable is the offset of the section table, NumSections its
	// number of entries.
	SectionTable, NumSections int
	// SizeOfHeaders is the optional header's SizeOfHeaders.
	SizeOfHeaders int
	// Sections are the entries of the section table.
	Sections []Section
}

// Section is one entry of the section table.
type Section struct {
	Name             string
	VirtualSize      uint32
	VirtualAddress   uint32
	SizeOfRawData    uint32
	PointerToRawData uint32
}

// Parse reads and checks the headers of a PE image. It never reads outside
// img.
func Parse(img []byte) (*Headers, error) {
	if len(img) < 0x40 || img[0] != 'M' || img[1] != 'Z' {
		return nil, errors.New("not a PE image: no MZ header")
	}
	peOff := int(binary.LittleEndian.Uint32(img[0x3c:]))
	if peOff < 0x40 || peOff > len(img)-24 || string(img[peOff:peOff+4]) != "PE\x00\x00" {
		return nil, errors.New("not a PE image: no PE signature")
	}
	h := &Headers{COFF: peOff + 4}
	h.NumSections = int(binary.LittleEndian.Uint16(img[h.COFF+2:]))
	h.OptionalSize = int(binary.LittleEndian.Uint16(img[h.COFF+16:]))
	h.Optional = h.COFF + 20
	if h.Optional+h.OptionalSize > len(img) || h.OptionalSize < 2 {
		return nil, errors.New("PE optional header is truncated")
	}
	var dirsAt, countAt int
	switch magic := binary.LittleEndian.Uint16(img[h.Optional:]); magic {
	case magicPE32:
		dirsAt, countAt = 96, 92
	case magicPE32Plus:
		h.PE32Plus = true
		dirsAt, countAt = 112, 108
	default:
		return nil, fmt.Errorf("unknown PE optional header magic %#x", magic)
	}
	if h.OptionalSize < dirsAt {
		return nil, errors.New("PE optional header is too short")
	}
	h.CheckSum = h.Optional + 64
	h.SizeOfHeaders = int(binary.LittleEndian.Uint32(img[h.Optional+60:]))
	h.NumDataDirs = int(binary.LittleEndian.Uint32(img[h.Optional+countAt:]))
	h.DataDirs = h.Optional + dirsAt
	if h.NumDataDirs > (h.OptionalSize-dirsAt)/8 {
		return nil, fmt.Errorf("PE optional header claims %d data directories but has room for %d", h.NumDataDirs, (h.OptionalSize-dirsAt)/8)
	}
	h.SectionTable = h.Optional + h.OptionalSize
	end := h.SectionTable + h.NumSections*sectionHeaderSize
	if end > len(img) {
		return nil, errors.New("PE section table is truncated")
	}
	if h.SizeOfHeaders < end || h.SizeOfHeaders > len(img) {
		return nil, fmt.Errorf("PE SizeOfHeaders %d is outside the image's headers", h.SizeOfHeaders)
	}
	for i := range h.NumSections {
		s := img[h.SectionTable+i*sectionHeaderSize:]
		name := s[:8]
		for j, c := range name {
			if c == 0 {
				name = name[:j]
				break
			}
		}
		sec := Section{
			Name:             string(name),
			VirtualSize:      binary.LittleEndian.Uint32(s[8:]),
			VirtualAddress:   binary.LittleEndian.Uint32(s[12:]),
			SizeOfRawData:    binary.LittleEndian.Uint32(s[16:]),
			PointerToRawData: binary.LittleEndian.Uint32(s[20:]),
		}
		if uint64(sec.PointerToRawData)+uint64(sec.SizeOfRawData) > uint64(len(img)) {
			return nil, fmt.Errorf("PE section %q lies outside the file", sec.Name)
		}
		h.Sections = append(h.Sections, sec)
	}
	return h, nil
}

// DataDir returns the RVA (for the Certificate Table: the file offset) and
// size of data directory i, zero if the image has fewer directories.
func (h *Headers) DataDir(img []byte, i int) (addr, size uint32) {
	if i >= h.NumDataDirs {
		return 0, 0
	}
	off := h.DataDirs + 8*i
	return binary.LittleEndian.Uint32(img[off:]), binary.LittleEndian.Uint32(img[off+4:])
}

// Authenticode writes img's Authenticode digest input into w.
func Authenticode(img []byte, w hash.Hash) error {
	h, err := Parse(img)
	if err != nil {
		return err
	}
	// Headers, without CheckSum and the Certificate Table entry.
	w.Write(img[:h.CheckSum])
	if h.NumDataDirs > securityDir {
		cert := h.DataDirs + 8*securityDir
		w.Write(img[h.CheckSum+4 : cert])
		w.Write(img[cert+8 : h.SizeOfHeaders])
	} else {
		w.Write(img[h.CheckSum+4 : h.SizeOfHeaders])
	}
	// Sections in order of their place in the file.
	sections := append([]Section(nil), h.Sections...)
	sort.SliceStable(sections, func(i, j int) bool { return sections[i].PointerToRawData < sections[j].PointerToRawData })
	hashed := uint64(h.SizeOfHeaders)
	for _, s := range sections {
		if s.SizeOfRawData == 0 {
			continue
		}
		w.Write(img[s.PointerToRawData : s.PointerToRawData+s.SizeOfRawData])
		hashed += uint64(s.SizeOfRawData)
	}
	// Data after the sections, except the certificate table.
	_, certSize := h.DataDir(img, securityDir)
	if uint64(len(img)) > hashed+uint64(certSize) {
		w.Write(img[hashed : uint64(len(img))-uint64(certSize)])
	}
	return nil
}

// AuthenticodeSHA256 returns img's SHA-256 Authenticode digest.
func AuthenticodeSHA256(img []byte) ([]byte, error) {
	w := sha256.New()
	if err := Authenticode(img, w); err != nil {
		return nil, fmt.Errorf("authenticode hash: %w", err)
	}
	return w.Sum(nil), nil
}
