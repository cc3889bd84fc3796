// Package uki assembles a unified kernel image (UKI): systemd-stub with the
// kernel, initrd, command line and os-release added as PE sections, the
// way systemd-stub 252 (Debian 12's systemd-boot-efi) expects them.
//
// Assemble appends the sections after the stub's own, in the file and in
// memory, and strips the stub's COFF symbol table (which lies after its
// sections and would end up between them). Its output is a pure function
// of its input, so two builds give the same UKI and the same measurements.
package uki

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/orrery-dev/orrery/internal/imagebuild/pe"
)

// Section names systemd-stub 252 knows. Sections are measured in this order
// (see MeasuredSections), whatever their order in the file.
const (
	Linux   = ".linux"
	OSRel   = ".osrel"
	Cmdline = ".cmdline"
	Initrd  = ".initrd"
	Splash  = ".splash"
	DTB     = ".dtb"
	PCRSig  = ".pcrsig"
	PCRPKey = ".pcrpkey"
)

// MeasuredSections lists, in systemd-stub 252's order, the sections it
// measures into PCR 11. .pcrsig is left out: it holds signatures of the
// measurements and cannot be part of them.
var MeasuredSections = []string{Linux, OSRel, Cmdline, Initrd, Splash, DTB, PCRPKey}

// StubRelease is the systemd release whose stub MeasuredSections
// describes. Later stubs measure more: 254's also measures its own .sbat
// section into PCR 11, so a UKI built on one would never match the
// prediction.
const StubRelease = "252"

// StubVersion reads the version systemd-stub records in its .sdmagic
// section ("#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####").
func StubVersion(stub []byte) (string, error) {
	secs, err := Sections(stub)
	if err != nil {
		return "", fmt.Errorf("parse stub: %w", err)
	}
	magic := string(bytes.TrimRight(secs[".sdmagic"], "\x00"))
	v, ok := strings.CutPrefix(magic, "#### LoaderInfo: systemd-stub ")
	v, ok2 := strings.CutSuffix(v, " ####")
	if !ok || !ok2 || v == "" {
		return "", errors.New("not a systemd-stub: it has no .sdmagic section naming systemd-stub's version")
	}
	return v, nil
}

// checkStub refuses a stub of another systemd release than StubRelease.
func checkStub(stub []byte) error {
	v, err := StubVersion(stub)
	if err != nil {
		return err
	}
	if release, _, _ := strings.Cut(v, "."); release != StubRelease {
		return fmt.Errorf("systemd-stub %s: the PCR 11 prediction follows systemd-stub %s (Debian 12's systemd-boot-efi), and other releases measure other sections; "+
			"install Debian 12's stub with 'make deps' (it runs apt-get install --allow-downgrades systemd-boot-efi/bookworm)", v, StubRelease)
	}
	return nil
}

// Section is a section to add to the stub.
type Section struct {
	Name string
	Data []byte
}

const (
	sectionHeaderSize = 40
	// scnData marks a section as initialised, readable data.
	scnData = 0x00000040 | 0x40000000
)

// Assemble returns the stub with sections appended in the given order.
// Each section's VirtualSize is the exact length of its data, which is what
// systemd-stub measures and passes on. Put .linux last, as systemd advises:
// the kernel may use the memory after its image.
func Assemble(stub []byte, sections []Section) ([]byte, error) {
	h, err := pe.Parse(stub)
	if err != nil {
		return nil, fmt.Errorf("parse stub: %w", err)
	}
	if err := checkStub(stub); err != nil {
		return nil, err
	}
	if err := checkSections(h, sections); err != nil {
		return nil, err
	}
	opt := h.Optional
	sectionAlign := uint64(binary.LittleEndian.Uint32(stub[opt+32:]))
	fileAlign := uint64(binary.LittleEndian.Uint32(stub[opt+36:]))
	if sectionAlign == 0 || fileAlign == 0 {
		return nil, errors.New("stub has a zero alignment")
	}
	// Where the stub's sections end, in the file and in memory.
	var fileEnd, memEnd uint64 = uint64(h.SizeOfHeaders), 0
	for _, s := range h.Sections {
		fileEnd = max(fileEnd, uint64(s.PointerToRawData)+uint64(s.SizeOfRawData))
		memEnd = max(memEnd, uint64(s.VirtualAddress)+uint64(max(s.VirtualSize, s.SizeOfRawData)))
	}
	fileEnd = alignUp(fileEnd, fileAlign)
	memEnd = alignUp(memEnd, sectionAlign)

	out := slices.Clone(stub[:min(uint64(len(stub)), fileEnd)])
	out = append(out, make([]byte, int(fileEnd)-len(out))...)
	// Strip the COFF symbol table: it would be left between sections.
	binary.LittleEndian.PutUint32(out[h.COFF+8:], 0)
	binary.LittleEndian.PutUint32(out[h.COFF+12:], 0)
	binary.LittleEndian.PutUint16(out[h.COFF+2:], uint16(h.NumSections+len(sections)))

	initData := binary.LittleEndian.Uint32(out[opt+8:])
	for i, s := range sections {
		size := uint64(len(s.Data))
		raw := alignUp(size, fileAlign)
		if memEnd+size > 1<<32-1 || uint64(len(out))+raw > 1<<32-1 {
			return nil, errors.New("sections do not fit in a PE image")
		}
		putSectionHeader(out[h.SectionTable+(h.NumSections+i)*sectionHeaderSize:], s.Name, size, memEnd, raw, uint64(len(out)))
		out = append(out, s.Data...)
		out = append(out, make([]byte, raw-size)...)
		memEnd = alignUp(memEnd+size, sectionAlign)
		initData += uint32(raw)
	}
	binary.LittleEndian.PutUint32(out[opt+8:], initData) // SizeOfInitializedData
	binary.LittleEndian.PutUint32(out[opt+56:], uint32(memEnd))
	// The checksum is not checked by UEFI and not part of the Authenticode
	// hash; zero says "not computed".
	binary.LittleEndian.PutUint32(out[h.CheckSum:], 0)
	if _, err := pe.Parse(out); err != nil {
		return nil, fmt.Errorf("assembled UKI does not parse: %w", err)
	}
	return out, nil
}

// checkSections refuses sections that cannot be added to the stub: bad or
// repeated names, empty data, or no room in the stub's section table.
func checkSections(h *pe.Headers, sections []Section) error {
	if !h.PE32Plus {
		return errors.New("stub is not a 64-bit PE image")
	}
	if len(sections) == 0 {
		return errors.New("no sections to add")
	}
	seen := map[string]bool{}
	for _, s := range h.Sections {
		seen[s.Name] = true
	}
	for _, s := range sections {
		if len(s.Name) == 0 || len(s.Name) > 8 {
			return fmt.Errorf("section name %q: must have 1 to 8 characters", s.Name)
		}
		if seen[s.Name] {
			return fmt.Errorf("section %s appears twice", s.Name)
		}
		if len(s.Data) == 0 {
			return fmt.Errorf("section %s is empty", s.Name)
		}
		seen[s.Name] = true
	}
	tableEnd := h.SectionTable + (h.NumSections+len(sections))*sectionHeaderSize
	if tableEnd > h.SizeOfHeaders {
		return fmt.Errorf("stub headers have no room for %d more sections", len(sections))
	}
	for _, s := range h.Sections {
		if s.SizeOfRawData > 0 && int(s.PointerToRawData) < tableEnd {
			return fmt.Errorf("stub section %s starts inside the grown section table", s.Name)
		}
	}
	return nil
}

// putSectionHeader writes the header of an initialised-data section.
func putSectionHeader(hdr []byte, name string, size, virtualAddress, rawSize, rawPointer uint64) {
	copy(hdr[:8], make([]byte, 8))
	copy(hdr[:8], name)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(size))            // VirtualSize
	binary.LittleEndian.PutUint32(hdr[12:], uint32(virtualAddress)) // VirtualAddress
	binary.LittleEndian.PutUint32(hdr[16:], uint32(rawSize))        // SizeOfRawData
	binary.LittleEndian.PutUint32(hdr[20:], uint32(rawPointer))     // PointerToRawData
	binary.LittleEndian.PutUint32(hdr[24:], 0)                      // PointerToRelocations
	binary.LittleEndian.PutUint32(hdr[28:], 0)                      // PointerToLinenumbers
	binary.LittleEndian.PutUint32(hdr[32:], 0)                      // NumberOf...
	binary.LittleEndian.PutUint32(hdr[36:], scnData)                // Characteristics
}

// Sections returns the contents of img's sections by name, each cut to its
// VirtualSize: the bytes systemd-stub measures.
func Sections(img []byte) (map[string][]byte, error) {
	h, err := pe.Parse(img)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, s := range h.Sections {
		n := min(s.VirtualSize, s.SizeOfRawData)
		data := img[s.PointerToRawData : s.PointerToRawData+n]
		if s.VirtualSize > s.SizeOfRawData {
			// Memory beyond the raw data is zero-filled by the loader.
			data = append(slices.Clone(data), make([]byte, s.VirtualSize-s.SizeOfRawData)...)
		}
		out[s.Name] = data
	}
	return out, nil
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }
