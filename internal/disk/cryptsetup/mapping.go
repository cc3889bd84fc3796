package cryptsetup

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// CheckMapping checks that /dev/mapper/<name> is what opening a volume
// with header h makes (see CheckTable). It reads the kernel's table with
// 'dmsetup table', which masks a key given in hex; it never asks for the
// keys (--showkeys).
func (t *Tool) CheckMapping(ctx context.Context, name string, h Header) error {
	table, err := t.run(ctx, t.dmsetup(), "table", name)
	if err != nil {
		return fmt.Errorf("read the device-mapper table of %s: %w", name, err)
	}
	return h.CheckTable(name, table)
}

// dmDevice is a device in a device-mapper table: major:minor.
var dmDevice = regexp.MustCompile(`^[0-9]{1,10}:[0-9]{1,10}$`)

// CheckTable checks the device-mapper table of the mapping name, as
// 'dmsetup table <name>' prints it, against what cryptsetup maps for
// header h. It accepts exactly one target, covering the mapping from
// sector 0, of type crypt, with:
//   - the cipher of h's data segment as the kernel names it: for AES-XTS
//     with HMAC-SHA256, capi:authenc(hmac(sha256),xts(aes))-plain64 (an
//     AEAD: dm-crypt checks each sector's tag);
//   - a key of h.Format.KeyBits, masked by dmsetup or a reference to the
//     kernel keyring (the key itself is never shown, even in errors);
//   - IV offset 0; a device major:minor; the data's offset on it (0 on
//     the dm-integrity device under an authenticated volume);
//   - the options integrity:<tag bytes>:aead and sector_size:<h.SectorSize>
//     (each when it applies), and no other (no allow_discards...).
//
// A table that differs fails with a *FormatError.
func (h Header) CheckTable(name string, table []byte) error {
	fail := func(field, got, want string) error {
		return &FormatError{Where: "device-mapper table of " + name, Field: field, Got: got, Want: want}
	}
	cipher, options, err := h.dmCipher()
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSuffix(string(table), "\n"), "\n")
	if len(lines) != 1 || lines[0] == "" {
		return fail("targets", fmt.Sprintf("%d lines", len(lines)), "one crypt target")
	}
	// Fields as dm-crypt and dmsetup print them: one space apart.
	f := strings.Split(lines[0], " ")
	if len(f) < 8 || slices.Contains(f, "") {
		return fail("target", fmt.Sprintf("%d fields", len(f)), "at least 8, one space apart")
	}
	if f[0] != "0" {
		return fail("start", quote(f[0]), `"0"`)
	}
	if n, err := strconv.ParseUint(f[1], 10, 64); err != nil || n == 0 {
		return fail("length", quote(f[1]), "a number of sectors")
	}
	if f[2] != "crypt" {
		return fail("target", quote(f[2]), `"crypt"`)
	}
	if f[3] != cipher {
		return fail("cipher", quote(f[3]), quote(cipher))
	}
	if err := h.checkKeyField(f[4]); err != nil {
		return fail("key", err.Error(), fmt.Sprintf("a %d-byte key", h.Format.KeyBits/8))
	}
	if f[5] != "0" {
		return fail("iv_offset", quote(f[5]), `"0"`)
	}
	if !dmDevice.MatchString(f[6]) {
		return fail("device", quote(f[6]), "major:minor")
	}
	offset := "0"
	if h.Format.Integrity == "" {
		offset = strconv.FormatInt(h.DataOffset/512, 10)
	}
	if f[7] != offset {
		return fail("offset", quote(f[7]), quote(offset))
	}
	var got []string
	if len(f) > 8 {
		n, err := strconv.Atoi(f[8])
		if err != nil || n != len(f)-9 {
			return fail("options", quote(strings.Join(f[8:], " ")), "a count and that many options")
		}
		got = slices.Clone(f[9:])
	}
	slices.Sort(got)
	slices.Sort(options)
	if !slices.Equal(got, options) {
		return fail("options", quote(strings.Join(got, " ")), quote(strings.Join(options, " ")))
	}
	return nil
}

// checkKeyField checks the key field of a crypt target without showing
// it: a reference to the kernel keyring, :<bytes>:<type>:<description>,
// or the hex key as dmsetup masks it, all zeros. Its error never holds
// the field.
func (h Header) checkKeyField(key string) error {
	want := h.Format.KeyBits / 8
	if rest, ok := strings.CutPrefix(key, ":"); ok {
		size, _, _ := strings.Cut(rest, ":")
		if size != strconv.Itoa(want) {
			return fmt.Errorf("a key in the kernel keyring of %s bytes", quote(size))
		}
		return nil
	}
	if strings.Trim(key, "0") != "" {
		return fmt.Errorf("not masked (not shown)")
	}
	if len(key) != 2*want {
		return fmt.Errorf("a masked key of %d bytes", len(key)/2)
	}
	return nil
}

// dmCipher is how cryptsetup 2.6 names h's data cipher to dm-crypt, and
// the options it adds to the target (cipher_dm2c and get_dm_crypt_params
// in lib/libdevmapper.c): CIPHER-MODE-IV as it is without integrity;
// with an HMAC, the kernel's AEAD capi:authenc(HMAC,MODE(CIPHER))-IV and
// the option integrity:<tag bytes>:aead.
func (h Header) dmCipher() (cipher string, options []string, err error) {
	if h.SectorSize != 512 {
		options = append(options, "sector_size:"+strconv.Itoa(h.SectorSize))
	}
	if h.Format.Integrity == "" {
		return h.Format.Cipher, options, nil
	}
	alg, ok := integrityAlgs[h.Format.Integrity]
	parts := strings.Split(h.Format.Cipher, "-")
	if !ok || len(parts) != 3 {
		return "", nil, fmt.Errorf("no device-mapper name for %s with integrity %s", h.Format.Cipher, h.Format.Integrity)
	}
	cipher = fmt.Sprintf("capi:authenc(%s,%s(%s))-%s", h.Format.Integrity, parts[1], parts[0], parts[2])
	return cipher, append(options, fmt.Sprintf("integrity:%d:aead", alg.tagBytes)), nil
}
