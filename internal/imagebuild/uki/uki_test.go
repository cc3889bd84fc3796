package uki

import (
	"bytes"
	"debug/pe"
	"os"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/nodepackages"
)

// readStub reads the systemd-stub the image pins; the test skips before
// 'make packages' fetched it.
func readStub(t *testing.T) []byte {
	t.Helper()
	path, err := nodepackages.Stub()
	if err != nil {
		t.Skip(err)
	}
	stub, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return stub
}

func TestAssemble(t *testing.T) {
	stub := readStub(t)
	want := []Section{
		{Name: OSRel, Data: []byte("ID=test\n")},
		{Name: Cmdline, Data: []byte("console=ttyS0")},
		{Name: Initrd, Data: bytes.Repeat([]byte{1}, 5000)},
		{Name: Linux, Data: bytes.Repeat([]byte{2}, 70000)},
	}
	img, err := Assemble(stub, want)
	if err != nil {
		t.Fatal(err)
	}
	// An independent parser agrees on the layout.
	f, err := pe.NewFile(bytes.NewReader(img))
	if err != nil {
		t.Fatalf("debug/pe cannot read the UKI: %v", err)
	}
	opt := f.OptionalHeader.(*pe.OptionalHeader64)
	var end uint32
	for i, s := range f.Sections {
		// (systemd's stub itself has an unaligned .sdmagic.)
		if s.VirtualAddress < end || (i >= len(f.Sections)-len(want) && s.VirtualAddress%opt.SectionAlignment != 0) {
			t.Errorf("section %s at %#x overlaps the one before or is misaligned", s.Name, s.VirtualAddress)
		}
		end = s.VirtualAddress + s.VirtualSize
		if i == len(f.Sections)-1 && opt.SizeOfImage < end {
			t.Errorf("SizeOfImage %#x < end of the last section %#x", opt.SizeOfImage, end)
		}
	}
	if f.FileHeader.PointerToSymbolTable != 0 {
		t.Error("symbol table not stripped")
	}
	got, err := Sections(img)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range want {
		if !bytes.Equal(got[s.Name], s.Data) {
			t.Errorf("section %s: got %d bytes, want its %d bytes back", s.Name, len(got[s.Name]), len(s.Data))
		}
	}
	if _, ok := got[".sdmagic"]; !ok {
		t.Error("the stub's own sections are gone")
	}
	again, _ := Assemble(stub, want)
	if !bytes.Equal(img, again) {
		t.Error("Assemble is not deterministic")
	}
}

func TestAssembleErrors(t *testing.T) {
	stub := readStub(t)
	many := make([]Section, 12)
	for i := range many {
		many[i] = Section{Name: string(rune('a'+i)) + "x", Data: []byte{1}}
	}
	testCases := map[string]struct {
		stub     []byte
		sections []Section
		wantErr  string
	}{
		"not a PE":    {stub: []byte("hello"), sections: []Section{{Name: Linux, Data: []byte{1}}}, wantErr: "parse stub"},
		"no sections": {stub: stub, wantErr: "no sections"},
		"long name":   {stub: stub, sections: []Section{{Name: ".toolongname", Data: []byte{1}}}, wantErr: "1 to 8"},
		"duplicate":   {stub: stub, sections: []Section{{Name: Linux, Data: []byte{1}}, {Name: Linux, Data: []byte{1}}}, wantErr: "twice"},
		"stub's own":  {stub: stub, sections: []Section{{Name: ".sbat", Data: []byte{1}}}, wantErr: "twice"},
		"empty":       {stub: stub, sections: []Section{{Name: Linux}}, wantErr: "empty"},
		"no room":     {stub: stub, sections: many, wantErr: "no room"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := Assemble(tc.stub, tc.sections)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Assemble() error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// A stub of another systemd release measures other sections into PCR 11
// (254's also measures its .sbat), so a UKI on it would never match the
// prediction: Assemble refuses it and says how to get the right one.
func TestAssembleRefusesAnotherStub(t *testing.T) {
	stub := readStub(t)
	v, err := StubVersion(stub)
	if err != nil || !strings.HasPrefix(v, StubRelease+".") {
		t.Fatalf("the installed stub's version: %q, %v; want systemd %s's ('make deps' installs it)", v, err, StubRelease)
	}
	sections := []Section{{Name: Linux, Data: []byte{1}}}
	newer := bytes.Replace(stub, []byte("systemd-stub "+StubRelease+"."), []byte("systemd-stub 254."), 1)
	if _, err := Assemble(newer, sections); err == nil || !strings.Contains(err.Error(), "systemd-stub 254.") || !strings.Contains(err.Error(), "make deps") {
		t.Errorf("a 254 stub: %v", err)
	}
	notStub := bytes.Replace(stub, []byte("#### LoaderInfo: systemd-stub"), []byte("#### LoaderInfo: another-stub"), 1)
	if _, err := Assemble(notStub, sections); err == nil || !strings.Contains(err.Error(), "not a systemd-stub") {
		t.Errorf("a stub that is not systemd's: %v", err)
	}
}
