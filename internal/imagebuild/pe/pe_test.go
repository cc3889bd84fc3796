package pe

import (
	"bytes"
	"crypto/sha256"
	"debug/pe"
	"encoding/binary"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// testImage builds a small PE32+ image with two sections, given data after
// the sections and an attribute certificate table of certSize bytes.
func testImage(trailer []byte, certSize int) []byte {
	const headers, align = 0x200, 0x200
	img := make([]byte, headers)
	copy(img, "MZ")
	binary.LittleEndian.PutUint32(img[0x3c:], 0x40)
	copy(img[0x40:], "PE\x00\x00")
	coff := 0x44
	binary.LittleEndian.PutUint16(img[coff:], 0x8664)
	binary.LittleEndian.PutUint16(img[coff+2:], 2)
	binary.LittleEndian.PutUint16(img[coff+16:], 240)
	opt := coff + 20
	binary.LittleEndian.PutUint16(img[opt:], magicPE32Plus)
	binary.LittleEndian.PutUint32(img[opt+32:], 0x1000)
	binary.LittleEndian.PutUint32(img[opt+36:], align)
	binary.LittleEndian.PutUint32(img[opt+56:], 0x3000)
	binary.LittleEndian.PutUint32(img[opt+60:], headers)
	binary.LittleEndian.PutUint32(img[opt+64:], 0x1234) // CheckSum
	binary.LittleEndian.PutUint32(img[opt+108:], 16)
	table := opt + 240
	for i, name := range []string{".text", ".data"} {
		s := img[table+40*i:]
		copy(s, name)
		binary.LittleEndian.PutUint32(s[8:], 0x100)
		binary.LittleEndian.PutUint32(s[12:], uint32(0x1000*(i+1)))
		binary.LittleEndian.PutUint32(s[16:], align)
		binary.LittleEndian.PutUint32(s[20:], uint32(headers+align*i))
	}
	img = append(img, bytes.Repeat([]byte{0xaa}, align)...)
	img = append(img, bytes.Repeat([]byte{0xbb}, align)...)
	img = append(img, trailer...)
	if certSize > 0 {
		binary.LittleEndian.PutUint32(img[opt+112+8*securityDir:], uint32(len(img)))
		binary.LittleEndian.PutUint32(img[opt+112+8*securityDir+4:], uint32(certSize))
		img = append(img, bytes.Repeat([]byte{0xcc}, certSize)...)
	}
	return img
}

// specHash is the Authenticode digest of testImage, written out by hand
// from the specification's steps.
func specHash(img []byte, trailer []byte) []byte {
	opt := 0x44 + 20
	h := sha256.New()
	h.Write(img[:opt+64])
	h.Write(img[opt+68 : opt+112+8*securityDir])
	h.Write(img[opt+112+8*securityDir+8 : 0x200])
	h.Write(img[0x200:0x600])
	h.Write(trailer)
	return h.Sum(nil)
}

func TestAuthenticode(t *testing.T) {
	testCases := map[string]struct {
		trailer  []byte
		certSize int
	}{
		"sections only":           {},
		"with certificate table":  {certSize: 64},
		"with trailing data":      {trailer: []byte("trailing data")},
		"trailer and certificate": {trailer: []byte("x"), certSize: 8},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			img := testImage(tc.trailer, tc.certSize)
			if _, err := pe.NewFile(bytes.NewReader(img)); err != nil {
				t.Fatalf("test image is not a PE file for debug/pe: %v", err)
			}
			got, err := AuthenticodeSHA256(img)
			if err != nil {
				t.Fatal(err)
			}
			if want := specHash(img, tc.trailer); !bytes.Equal(got, want) {
				t.Errorf("AuthenticodeSHA256() = %x, want %x", got, want)
			}
		})
	}
}

func TestAuthenticodeIgnoresChecksumAndCertificates(t *testing.T) {
	img := testImage(nil, 16)
	want, _ := AuthenticodeSHA256(img)
	changed := bytes.Clone(img)
	binary.LittleEndian.PutUint32(changed[0x44+20+64:], 0xdeadbeef) // CheckSum
	changed[len(changed)-1] ^= 0xff                                 // certificate
	if got, _ := AuthenticodeSHA256(changed); !bytes.Equal(got, want) {
		t.Error("changing the checksum or the certificate table changed the hash")
	}
	changed = bytes.Clone(img)
	changed[0x300] ^= 0xff // section data
	if got, _ := AuthenticodeSHA256(changed); bytes.Equal(got, want) {
		t.Error("changing section data did not change the hash")
	}
}

func TestParseErrors(t *testing.T) {
	good := testImage(nil, 0)
	testCases := map[string]struct {
		img     []byte
		wantErr string
	}{
		"empty":           {img: nil, wantErr: "no MZ header"},
		"no PE signature": {img: append(bytes.Clone(good[:0x40]), make([]byte, 0x40)...), wantErr: "no PE signature"},
		"truncated table": {img: good[:0x44+20+250], wantErr: "truncated"},
		"section outside": {img: good[:0x400], wantErr: "outside the file"},
		"bad magic": {img: func() []byte {
			b := bytes.Clone(good)
			b[0x44+20] = 0
			return b
		}(), wantErr: "magic"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := AuthenticodeSHA256(tc.img)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestDebianKernel checks the digest that OVMF 2022.11 measured into PCR 4
// for Debian's 6.1.0-56 cloud kernel (linux-image-6.1.0-56-cloud-amd64
// 6.1.192-2) on a real boot, on machines that have that very file.
func TestDebianKernel(t *testing.T) {
	const (
		path       = "/boot/vmlinuz-6.1.0-56-cloud-amd64"
		fileSHA256 = "51349501a3d1ff83836437d2b365fd2d57f2feb8642d315e5181dec23d4c3275"
		measured   = "5f21ff2c0d5d899842b28a8b19901ba72cf7a7ab93c02a77fadc6ff72be85b31"
	)
	img, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("no %s: %v", path, err)
	}
	if sum := sha256.Sum256(img); hex.EncodeToString(sum[:]) != fileSHA256 {
		t.Skipf("%s is another build of the kernel", path)
	}
	got, err := AuthenticodeSHA256(img)
	if err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(got) != measured {
		t.Errorf("AuthenticodeSHA256(%s) = %x, OVMF measured %s", path, got, measured)
	}
}

func FuzzAuthenticode(f *testing.F) {
	f.Add(testImage(nil, 0))
	f.Add(testImage([]byte("tail"), 16))
	f.Fuzz(func(t *testing.T, img []byte) {
		_, _ = AuthenticodeSHA256(img)
	})
}
