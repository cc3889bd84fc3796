package launch

import (
	"bytes"
	"crypto/sha512"
	"encoding/binary"
	"testing"
)

// TestOnePage works PAGE_INFO out by hand, field by field, for a single
// page: the layout the specification gives (0x70 bytes).
func TestOnePage(t *testing.T) {
	page := bytes.Repeat([]byte{0xab}, pageSize)
	got, err := Firmware(page)
	if err != nil {
		t.Fatal(err)
	}
	contents := sha512.Sum384(page)
	var info bytes.Buffer
	info.Write(make([]byte, 48)) // DIGEST_CUR: zero before the first page
	info.Write(contents[:])      // CONTENTS
	binary.Write(&info, binary.LittleEndian, uint16(0x70))
	info.Write([]byte{1, 0, 0, 0, 0, 0}) // PAGE_TYPE normal, IMI, VMPL3/2/1 perms, reserved
	binary.Write(&info, binary.LittleEndian, uint64(1<<32-pageSize))
	if info.Len() != 0x70 {
		t.Fatalf("PAGE_INFO is %d bytes", info.Len())
	}
	if want := sha512.Sum384(info.Bytes()); got != want {
		t.Fatalf("launch digest %x, want %x", got, want)
	}
}

func TestEveryPageAndItsPlaceCount(t *testing.T) {
	fw := make([]byte, 4*pageSize)
	base, _ := Firmware(fw)
	changed := append([]byte(nil), fw...)
	changed[3*pageSize+17] = 1
	if d, _ := Firmware(changed); d == base {
		t.Fatal("a changed byte in the last page leaves the measurement alone")
	}
	// The same pages, mapped lower (a larger image), measure differently.
	if d, _ := Firmware(make([]byte, 5*pageSize)); d == base {
		t.Fatal("the measurement does not depend on where the pages are")
	}
}

func TestBadSizes(t *testing.T) {
	for _, n := range []int{0, 100, pageSize + 1} {
		if _, err := Firmware(make([]byte, n)); err == nil {
			t.Errorf("%d-byte firmware accepted", n)
		}
	}
}

// BenchmarkOVMFSized measures a 4 MiB firmware, the size of Debian's
// OVMF_CODE_4M.fd.
func BenchmarkOVMFSized(b *testing.B) {
	fw := make([]byte, 4<<20)
	b.SetBytes(int64(len(fw)))
	for b.Loop() {
		if _, err := Firmware(fw); err != nil {
			b.Fatal(err)
		}
	}
}
