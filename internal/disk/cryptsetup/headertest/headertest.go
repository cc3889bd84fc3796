// Package headertest rewrites the LUKS2 header of a volume in a file as
// whoever holds the disk can: the header's JSON is only checksummed, so
// anyone may change it and fix the checksums. Tests use it to show that
// Orrery refuses such a header (see cryptsetup.Header).
package headertest

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"os"
	"strconv"
	"testing"
)

// Rewrite decodes the JSON area of the LUKS2 header in img (numbers as
// json.Number), lets edit change it, and writes it back to both header
// copies with their checksums fixed: the port of the review's
// nullsegment.py. Only SHA-256 checksums, as cryptsetup writes them, are
// supported.
func Rewrite(t testing.TB, img string, edit func(m map[string]any)) {
	t.Helper()
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bin := make([]byte, 4096)
	if _, err := f.ReadAt(bin, 0); err != nil {
		t.Fatal(err)
	}
	if string(bin[:6]) != "LUKS\xba\xbe" || binary.BigEndian.Uint16(bin[6:8]) != 2 {
		t.Fatalf("%s has no LUKS2 header", img)
	}
	if alg := string(bytes.TrimRight(bin[72:104], "\x00")); alg != "sha256" {
		t.Fatalf("%s: header checksum %q, want sha256", img, alg)
	}
	hdrSize := int64(binary.BigEndian.Uint64(bin[8:16]))
	if hdrSize < 16<<10 || hdrSize > 4<<20 {
		t.Fatalf("%s: header size %d", img, hdrSize)
	}
	area := make([]byte, hdrSize-4096)
	if _, err := f.ReadAt(area, 4096); err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(bytes.TrimRight(area, "\x00")))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	js, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(js) > len(area) {
		t.Fatalf("%d bytes of JSON do not fit the %d-byte area", len(js), len(area))
	}
	area = append(js, make([]byte, len(area)-len(js))...)
	// The checksum covers the binary header, its checksum field zeroed,
	// and the JSON area; each copy keeps its own binary header.
	for _, off := range []int64{0, hdrSize} {
		if _, err := f.ReadAt(bin, off); err != nil {
			t.Fatal(err)
		}
		clear(bin[448:512])
		sum := sha256.Sum256(append(bytes.Clone(bin), area...))
		copy(bin[448:], sum[:])
		if _, err := f.WriteAt(append(bytes.Clone(bin), area...), off); err != nil {
			t.Fatal(err)
		}
	}
}

// At walks m along path, each step an object.
func At(m map[string]any, path ...string) map[string]any {
	for _, p := range path {
		m = m[p].(map[string]any)
	}
	return m
}

// NullSegment maps the data segment in clear (cipher_null) without
// integrity, as the review's proof of concept does: the real keyslots
// still open it, and the host's plaintext becomes the node's state.
func NullSegment(m map[string]any) {
	s := At(m, "segments", "0")
	s["encryption"] = "cipher_null-ecb"
	delete(s, "integrity")
}

// AddIntegrity gives a header formatted without integrity (hosts without
// device-mapper cannot format dm-integrity) what cryptsetup 2.6 writes
// with --integrity hmac-sha256: the data segment's integrity (see
// json_segment_create_crypt in lib/luks2/luks2_json_format.c) and a
// volume key 32 bytes longer for the HMAC. The keyslots no longer open:
// the header is for checking, not for opening.
func AddIntegrity(m map[string]any) {
	At(m, "segments", "0")["integrity"] = map[string]any{"type": "hmac(sha256)", "journal_encryption": "none", "journal_integrity": "none"}
	for _, k := range At(m, "keyslots") {
		k := k.(map[string]any)
		n, _ := k["key_size"].(json.Number).Int64()
		k["key_size"] = json.Number(strconv.FormatInt(n+32, 10))
	}
}
