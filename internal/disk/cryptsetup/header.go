package cryptsetup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Header is the exact LUKS2 header of a volume, as Orrery formats it. A
// LUKS2 header is not authenticated (its checksums are plain SHA-256), so
// whoever holds the disk can rewrite it: point the data segment at
// cipher_null, drop its integrity, add a keyslot "encrypted" with
// cipher_null that any passphrase opens (cryptsetup before 2.8.1) or a
// token. The right key still opens such a volume, and maps the holder's
// plaintext. CheckMetadata therefore accepts exactly this layout and
// nothing else; cryptsetup's defaults never decide what is accepted.
type Header struct {
	// Format is the data segment's protection.
	Format Format
	// SectorSize is the data segment's encryption sector, in bytes.
	SectorSize int
	// DataOffset is where the data segment starts, in bytes: everything
	// before it is the header area (two copies of the metadata, then the
	// keyslots), which SaveHeader copies.
	DataOffset int64
	// JSONSize and KeyslotsSize are the header's config: the JSON area
	// of one metadata copy and the keyslots area, in bytes.
	JSONSize, KeyslotsSize int64
	// KeyslotCipher and KeyslotKeyBits encrypt each keyslot's area.
	KeyslotCipher  string
	KeyslotKeyBits int
	// PBKDF and Iterations derive each keyslot's key; Hash is the PBKDF's
	// hash, the anti-forensic splitter's and the digest's.
	PBKDF      string
	Iterations int
	Hash       string
	// AFStripes is each keyslot's anti-forensic stripe count.
	AFStripes int
	// MaxKeyslots is how many keyslots the volume may have at once.
	MaxKeyslots int
}

// StateDisk is how the initrd formats a node's state disk and how every
// boot checks it: AES-XTS with HMAC-SHA256 per 4 KiB sector
// (Authenticated), the data 16 MiB in, PBKDF2-SHA256 with 1000 iterations
// (keys are 32 random bytes: a slow derivation would only cost boot
// time), keyslots encrypted with AES-XTS. Two keyslots at most: the
// first-boot passphrase and the cluster's key while bootstrapperd
// re-keys the disk, then the cluster's key alone.
var StateDisk = Header{
	Format:         Authenticated,
	SectorSize:     4096,
	DataOffset:     16 << 20,
	JSONSize:       12 << 10,
	KeyslotsSize:   16<<20 - 32<<10,
	KeyslotCipher:  "aes-xts-plain64",
	KeyslotKeyBits: 512,
	PBKDF:          "pbkdf2",
	Iterations:     1000,
	Hash:           "sha256",
	AFStripes:      4000,
	MaxKeyslots:    2,
}

// FormatOpts are the options with which FormatLUKS2 writes h.
func (h Header) FormatOpts() FormatOpts {
	return FormatOpts{
		Format: h.Format, PBKDF: h.PBKDF, Iterations: h.Iterations, Hash: h.Hash,
		SectorSize: h.SectorSize, DataOffset: h.DataOffset,
		KeyslotCipher: h.KeyslotCipher, KeyslotKeyBits: h.KeyslotKeyBits,
	}
}

// FormatError says how a volume differs from what Orrery formats: a
// field of its LUKS2 header, or of its device-mapper table once opened.
type FormatError struct {
	// Where is what was read: "LUKS2 header of /dev/vdb".
	Where string
	// Field names the field, as a path: "segments.0.encryption".
	Field string
	// Got is what the field holds (quoted, and cut if long); Want what
	// it should hold.
	Got, Want string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s: %s is %s, want %s", e.Where, e.Field, e.Got, e.Want)
}

// maxMetadata bounds the 'luksDump --dump-json-metadata' output that
// CheckMetadata reads. Orrery's header is about 1.5 KiB of JSON per
// keyslot; cryptsetup's own limit is the 4 MiB metadata area.
const maxMetadata = 64 << 10

// quote shows a value read from a disk: quoted (no control characters
// reach the console) and at most 64 bytes of it.
func quote(s string) string {
	const limit = 64
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}

// CheckMetadata checks the output of 'cryptsetup luksDump
// --dump-json-metadata' (cryptsetup's reading of the header's JSON area)
// against h. It accepts exactly:
//   - top-level fields keyslots, tokens, segments, digests and config,
//     and no other;
//   - no token;
//   - one data segment "0": type crypt, offset h.DataOffset, size
//     dynamic, iv_tweak 0, encryption h.Format.Cipher, sector_size
//     h.SectorSize, and integrity {type h.Format.Integrity,
//     journal_encryption none, journal_integrity none} (no integrity
//     field when h.Format has none), no flags;
//   - 1 to h.MaxKeyslots keyslots, each of type luks2 with a volume key
//     of h.Format.KeyBits, AF luks1 with h.AFStripes stripes and h.Hash,
//     a raw area inside the keyslots area encrypted with h.KeyslotCipher
//     and a key of h.KeyslotKeyBits, KDF h.PBKDF with h.Hash and
//     h.Iterations, and no priority or other field;
//   - one digest "0" of type pbkdf2 with h.Hash, for every keyslot and
//     segment 0 only;
//   - config json_size h.JSONSize and keyslots_size h.KeyslotsSize, no
//     flags and no requirements.
//
// It returns the data segment's protection (the Volume without UUID). A
// header that differs fails with a *FormatError naming the first field
// that differs.
func (h Header) CheckMetadata(raw []byte) (Volume, error) {
	fail := func(field, got, want string) (Volume, error) {
		return Volume{}, &FormatError{Where: "LUKS2 header", Field: field, Got: got, Want: want}
	}
	if len(raw) > maxMetadata {
		return fail("metadata", fmt.Sprintf("%d bytes", len(raw)), fmt.Sprintf("at most %d", maxMetadata))
	}
	root, err := decodeObject("", raw)
	if err != nil {
		return Volume{}, err
	}
	if err := root.only("keyslots", "tokens", "segments", "digests", "config"); err != nil {
		return Volume{}, err
	}
	segments, err := root.object("segments")
	if err != nil {
		return Volume{}, err
	}
	if err := h.checkSegments(segments); err != nil {
		return Volume{}, err
	}
	keyslots, err := root.object("keyslots")
	if err != nil {
		return Volume{}, err
	}
	ids, err := h.checkKeyslots(keyslots)
	if err != nil {
		return Volume{}, err
	}
	digests, err := root.object("digests")
	if err != nil {
		return Volume{}, err
	}
	if err := h.checkDigests(digests, ids); err != nil {
		return Volume{}, err
	}
	tokens, err := root.object("tokens")
	if err != nil {
		return Volume{}, err
	}
	if len(tokens.fields) != 0 {
		return fail("tokens", fmt.Sprintf("%d token(s), %s first", len(tokens.fields), quote(tokens.keys()[0])), "none")
	}
	config, err := root.object("config")
	if err != nil {
		return Volume{}, err
	}
	if err := config.only("json_size", "keyslots_size"); err != nil {
		return Volume{}, err
	}
	if err := config.wantString("json_size", strconv.FormatInt(h.JSONSize, 10)); err != nil {
		return Volume{}, err
	}
	if err := config.wantString("keyslots_size", strconv.FormatInt(h.KeyslotsSize, 10)); err != nil {
		return Volume{}, err
	}
	return Volume{Cipher: h.Format.Cipher, KeyBits: h.Format.KeyBits, Integrity: h.Format.Integrity}, nil
}

func (h Header) checkSegments(segments object) error {
	if err := segments.only("0"); err != nil {
		return err
	}
	s, err := segments.object("0")
	if err != nil {
		return err
	}
	want := []string{"type", "offset", "size", "iv_tweak", "encryption", "sector_size"}
	if h.Format.Integrity != "" {
		want = append(want, "integrity")
	}
	// The cipher first: it is what a tampered header changes.
	if err := s.wantString("encryption", h.Format.Cipher); err != nil {
		return err
	}
	if h.Format.Integrity != "" {
		integrity, err := s.object("integrity")
		if err != nil {
			return err
		}
		if err := integrity.wantString("type", h.Format.Integrity); err != nil {
			return err
		}
		if err := integrity.only("type", "journal_encryption", "journal_integrity"); err != nil {
			return err
		}
		for _, k := range []string{"journal_encryption", "journal_integrity"} {
			if err := integrity.wantString(k, "none"); err != nil {
				return err
			}
		}
	}
	if err := s.only(want...); err != nil {
		return err
	}
	for _, f := range [][2]string{
		{"type", "crypt"}, {"offset", strconv.FormatInt(h.DataOffset, 10)}, {"size", "dynamic"}, {"iv_tweak", "0"},
	} {
		if err := s.wantString(f[0], f[1]); err != nil {
			return err
		}
	}
	return s.wantNumber("sector_size", int64(h.SectorSize))
}

// checkKeyslots checks every keyslot and returns their IDs, sorted.
func (h Header) checkKeyslots(keyslots object) ([]string, error) {
	ids := keyslots.keys()
	if len(ids) == 0 || len(ids) > h.MaxKeyslots {
		return nil, &FormatError{Where: "LUKS2 header", Field: "keyslots", Got: fmt.Sprintf("%d keyslots", len(ids)), Want: fmt.Sprintf("1 to %d", h.MaxKeyslots)}
	}
	areaEnd := 2*(h.JSONSize+4096) + h.KeyslotsSize
	for _, id := range ids {
		if n, err := strconv.Atoi(id); err != nil || n < 0 || n > 31 || strconv.Itoa(n) != id {
			return nil, &FormatError{Where: "LUKS2 header", Field: "keyslots", Got: "a keyslot " + quote(id), Want: "keyslots 0 to 31"}
		}
		k, err := keyslots.object(id)
		if err != nil {
			return nil, err
		}
		if err := k.only("type", "key_size", "af", "area", "kdf"); err != nil {
			return nil, err
		}
		if err := k.wantString("type", "luks2"); err != nil {
			return nil, err
		}
		if err := k.wantNumber("key_size", int64(h.Format.KeyBits/8)); err != nil {
			return nil, err
		}
		area, err := k.object("area")
		if err != nil {
			return nil, err
		}
		if err := h.checkArea(area, areaEnd); err != nil {
			return nil, err
		}
		kdf, err := k.object("kdf")
		if err != nil {
			return nil, err
		}
		if err := kdf.wantString("type", h.PBKDF); err != nil {
			return nil, err
		}
		if err := kdf.only("type", "hash", "iterations", "salt"); err != nil {
			return nil, err
		}
		if err := kdf.wantString("hash", h.Hash); err != nil {
			return nil, err
		}
		if err := kdf.wantNumber("iterations", int64(h.Iterations)); err != nil {
			return nil, err
		}
		if _, err := kdf.string("salt"); err != nil {
			return nil, err
		}
		af, err := k.object("af")
		if err != nil {
			return nil, err
		}
		if err := af.only("type", "stripes", "hash"); err != nil {
			return nil, err
		}
		if err := af.wantString("type", "luks1"); err != nil {
			return nil, err
		}
		if err := af.wantNumber("stripes", int64(h.AFStripes)); err != nil {
			return nil, err
		}
		if err := af.wantString("hash", h.Hash); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// checkArea checks a keyslot's area: encrypted as h says, and inside the
// keyslots area, which ends at areaEnd.
func (h Header) checkArea(area object, areaEnd int64) error {
	if err := area.wantString("encryption", h.KeyslotCipher); err != nil {
		return err
	}
	if err := area.only("type", "offset", "size", "encryption", "key_size"); err != nil {
		return err
	}
	if err := area.wantString("type", "raw"); err != nil {
		return err
	}
	if err := area.wantNumber("key_size", int64(h.KeyslotKeyBits/8)); err != nil {
		return err
	}
	start := 2 * (h.JSONSize + 4096)
	offset, err := area.decimal("offset", start, areaEnd-1)
	if err != nil {
		return err
	}
	_, err = area.decimal("size", 1, areaEnd-offset)
	return err
}

func (h Header) checkDigests(digests object, keyslots []string) error {
	if err := digests.only("0"); err != nil {
		return err
	}
	d, err := digests.object("0")
	if err != nil {
		return err
	}
	if err := d.only("type", "keyslots", "segments", "hash", "iterations", "salt", "digest"); err != nil {
		return err
	}
	if err := d.wantString("type", "pbkdf2"); err != nil {
		return err
	}
	if err := d.wantString("hash", h.Hash); err != nil {
		return err
	}
	if _, err := d.decimalNumber("iterations"); err != nil {
		return err
	}
	for _, k := range []string{"salt", "digest"} {
		if _, err := d.string(k); err != nil {
			return err
		}
	}
	if err := d.wantStrings("keyslots", keyslots); err != nil {
		return err
	}
	return d.wantStrings("segments", []string{"0"})
}

// object is a JSON object of the header, with its path for errors.
type object struct {
	path   string
	fields map[string]json.RawMessage
}

// decodeObject decodes the object at path ("" for the metadata itself).
func decodeObject(path string, raw []byte) (object, error) {
	o := object{path: path}
	if err := json.Unmarshal(raw, &o.fields); err != nil || o.fields == nil {
		if path == "" {
			path = "metadata"
		}
		return o, &FormatError{Where: "LUKS2 header", Field: path, Got: "not a JSON object", Want: "an object"}
	}
	return o, nil
}

// field is the path of the object's field key.
func (o object) field(key string) string {
	if o.path == "" {
		return key
	}
	return o.path + "." + key
}

func (o object) err(key, got, want string) error {
	return &FormatError{Where: "LUKS2 header", Field: o.field(key), Got: got, Want: want}
}

// keys returns the object's field names, sorted (errors name the same
// field every time).
func (o object) keys() []string {
	keys := make([]string, 0, len(o.fields))
	for k := range o.fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// only fails on the first field (by name) not in allowed.
func (o object) only(allowed ...string) error {
	for _, k := range o.keys() {
		if !slices.Contains(allowed, k) {
			return o.err(k, "present", "absent (not a field Orrery writes)")
		}
	}
	return nil
}

func (o object) object(key string) (object, error) {
	raw, ok := o.fields[key]
	if !ok {
		return object{}, o.err(key, "absent", "an object")
	}
	return decodeObject(o.field(key), raw)
}

func (o object) string(key string) (string, error) {
	raw, ok := o.fields[key]
	if !ok {
		return "", o.err(key, "absent", "a string")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", o.err(key, "not a string", "a string")
	}
	return s, nil
}

func (o object) wantString(key, want string) error {
	raw, ok := o.fields[key]
	if !ok {
		return o.err(key, "absent", quote(want))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return o.err(key, "not a string", quote(want))
	}
	if s != want {
		return o.err(key, quote(s), quote(want))
	}
	return nil
}

// decimalNumber reads a JSON number that is a non-negative integer
// written plainly (no sign, fraction or exponent).
func (o object) decimalNumber(key string) (int64, error) {
	raw, ok := o.fields[key]
	if !ok {
		return 0, o.err(key, "absent", "a number")
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != string(bytes.TrimSpace(raw)) {
		return 0, o.err(key, quote(string(raw)), "a non-negative integer")
	}
	return n, nil
}

func (o object) wantNumber(key string, want int64) error {
	n, err := o.decimalNumber(key)
	if err != nil {
		var fe *FormatError
		if errors.As(err, &fe) {
			fe.Want = strconv.FormatInt(want, 10)
		}
		return err
	}
	if n != want {
		return o.err(key, strconv.FormatInt(n, 10), strconv.FormatInt(want, 10))
	}
	return nil
}

// decimal reads a 64-bit value, which LUKS2 writes as a string of
// decimal digits, and checks it is in [lo, hi].
func (o object) decimal(key string, lo, hi int64) (int64, error) {
	s, err := o.string(key)
	if err != nil {
		return 0, err
	}
	want := fmt.Sprintf("%d to %d", lo, hi)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != s || n < lo || n > hi {
		return 0, o.err(key, quote(s), want)
	}
	return n, nil
}

// wantStrings checks an array of strings holds exactly want, in any order.
func (o object) wantStrings(key string, want []string) error {
	wantDesc := quote(strings.Join(want, ","))
	raw, ok := o.fields[key]
	if !ok {
		return o.err(key, "absent", wantDesc)
	}
	var got []string
	if err := json.Unmarshal(raw, &got); err != nil {
		return o.err(key, "not an array of strings", wantDesc)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return o.err(key, quote(strings.Join(got, ",")), wantDesc)
	}
	return nil
}

// CheckHeader reads the LUKS2 header of dev (a disk, or a header file
// SaveHeader wrote) with cryptsetup and checks it is exactly h (see
// CheckMetadata); the Volume it returns carries the header's UUID. A
// header that differs fails with a *FormatError.
//
// The check reads dev once; cryptsetup reads it again to open it. On a
// disk the host controls, open with a copy that SaveHeader checked.
func (t *Tool) CheckHeader(ctx context.Context, dev string, h Header) (Volume, error) {
	raw, err := t.run(ctx, t.cryptsetup(), "luksDump", "--dump-json-metadata", dev)
	if err != nil {
		return Volume{}, err
	}
	v, err := h.CheckMetadata(raw)
	if err != nil {
		var fe *FormatError
		if errors.As(err, &fe) {
			fe.Where = "LUKS2 header of " + dev
		}
		return Volume{}, err
	}
	if v.UUID, err = t.UUID(ctx, dev); err != nil {
		return Volume{}, err
	}
	return v, nil
}

// SaveHeader copies the header area of dev (its first h.DataOffset
// bytes: both copies of the metadata and the keyslots) to a new file at
// path, and checks the copy with CheckHeader. Opening dev with that copy
// as its header (TestKeyWithHeader, OpenChecked) uses exactly the bytes
// that were checked: a host that controls dev cannot show the check one
// header and cryptsetup another. On error no file is left at path.
func (t *Tool) SaveHeader(ctx context.Context, dev, path string, h Header) (Volume, error) {
	if h.DataOffset <= 0 || h.DataOffset > 64<<20 {
		return Volume{}, fmt.Errorf("save the LUKS2 header of %s: a header area of %d bytes", dev, h.DataOffset)
	}
	if err := copyHeader(dev, path, h.DataOffset); err != nil {
		return Volume{}, fmt.Errorf("save the LUKS2 header of %s: %w", dev, err)
	}
	v, err := t.CheckHeader(ctx, path, h)
	if err != nil {
		os.Remove(path)
		var fe *FormatError
		if errors.As(err, &fe) {
			fe.Where = "LUKS2 header of " + dev
		}
		return Volume{}, err
	}
	return v, nil
}

// copyHeader copies the first size bytes of dev to a new file at path.
func copyHeader(dev, path string, size int64) (err error) {
	in, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	n, err := io.Copy(out, io.LimitReader(in, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s holds %d bytes, less than its %d-byte header area", dev, n, size)
	}
	return err
}
