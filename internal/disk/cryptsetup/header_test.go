package cryptsetup

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup/headertest"
)

// orreryMetadata is what 'luksDump --dump-json-metadata' shows of a state
// disk the initrd formatted (StateDisk), compacted: cryptsetup 2.6.1's
// output for StateDisk.FormatOpts() on a host, plus the integrity the
// VM's cryptsetup adds (json_segment_create_crypt in
// lib/luks2/luks2_json_format.c) and the 96-byte volume key that comes
// with it.
const orreryMetadata = `{"keyslots":{"0":{"type":"luks2","key_size":96,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},` +
	`"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},` +
	`"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"r7+MsxbyyqqDe7jzo2HY773EayJfcd5XXvf3PkGJhLg="}}},` +
	`"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0",` +
	`"encryption":"aes-xts-plain64","sector_size":4096,` +
	`"integrity":{"type":"hmac(sha256)","journal_encryption":"none","journal_integrity":"none"}}},` +
	`"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,` +
	`"salt":"4AYXa36AOJryM5vIM8jhXA/mN6UIl63K6oY/LW4r0aA=","digest":"J6dpe+GifjJIwyGiY5Dl/TgGK2uBWxD40/jPwzmJEKw="}},` +
	`"config":{"json_size":"12288","keyslots_size":"16744448"}}`

// metadataWith is orreryMetadata changed by edit, which gets it decoded.
func metadataWith(t testing.TB, edit func(m map[string]any)) []byte {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(orreryMetadata))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tampering are the ways a host rewrites a state disk's header, each with
// the field the check must name.
var tampering = map[string]struct {
	edit  func(m map[string]any)
	field string
}{
	// /tmp/review/poc/nullsegment.py: the attacker's plaintext behind the
	// real keyslots.
	"cipher_null segment": {headertest.NullSegment, "segments.0.encryption"},
	"no integrity":        {func(m map[string]any) { delete(headertest.At(m, "segments", "0"), "integrity") }, "segments.0.integrity"},
	"other integrity":     {func(m map[string]any) { headertest.At(m, "segments", "0", "integrity")["type"] = "crc32c" }, "segments.0.integrity.type"},
	"integrity journal MAC": {func(m map[string]any) {
		headertest.At(m, "segments", "0", "integrity")["journal_integrity"] = "hmac(sha256)"
	}, "segments.0.integrity.journal_integrity"},
	"512-byte sectors":   {func(m map[string]any) { headertest.At(m, "segments", "0")["sector_size"] = json.Number("512") }, "segments.0.sector_size"},
	"data at sector 0":   {func(m map[string]any) { headertest.At(m, "segments", "0")["offset"] = "0" }, "segments.0.offset"},
	"segment flags":      {func(m map[string]any) { headertest.At(m, "segments", "0")["flags"] = []string{"backup-previous"} }, "segments.0.flags"},
	"fixed segment size": {func(m map[string]any) { headertest.At(m, "segments", "0")["size"] = "4096" }, "segments.0.size"},
	"second segment": {func(m map[string]any) {
		headertest.At(m, "segments")["1"] = map[string]any{"type": "linear", "offset": "0", "size": "dynamic"}
	}, "segments.1"},
	// /tmp/review/poc/craft.py: a keyslot any passphrase opens
	// (cryptsetup < 2.8.1).
	"cipher_null keyslot": {func(m map[string]any) {
		a := headertest.At(m, "keyslots", "0", "area")
		a["encryption"] = "cipher_null-ecb"
		a["key_size"] = json.Number("0")
	}, "keyslots.0.area.encryption"},
	"argon2 keyslot": {func(m map[string]any) {
		headertest.At(m, "keyslots", "0")["kdf"] = map[string]any{"type": "argon2id", "time": 4, "memory": 32, "cpus": 1, "salt": "AA=="}
	}, "keyslots.0.kdf.type"},
	"sha1 keyslot":        {func(m map[string]any) { headertest.At(m, "keyslots", "0", "kdf")["hash"] = "sha1" }, "keyslots.0.kdf.hash"},
	"one stripe":          {func(m map[string]any) { headertest.At(m, "keyslots", "0", "af")["stripes"] = json.Number("1") }, "keyslots.0.af.stripes"},
	"short volume key":    {func(m map[string]any) { headertest.At(m, "keyslots", "0")["key_size"] = json.Number("64") }, "keyslots.0.key_size"},
	"keyslot priority":    {func(m map[string]any) { headertest.At(m, "keyslots", "0")["priority"] = json.Number("2") }, "keyslots.0.priority"},
	"reencrypt keyslot":   {func(m map[string]any) { headertest.At(m, "keyslots", "0")["type"] = "reencrypt" }, "keyslots.0.type"},
	"area over the data":  {func(m map[string]any) { headertest.At(m, "keyslots", "0", "area")["offset"] = "16777216" }, "keyslots.0.area.offset"},
	"area in the headers": {func(m map[string]any) { headertest.At(m, "keyslots", "0", "area")["offset"] = "4096" }, "keyslots.0.area.offset"},
	"three keyslots": {func(m map[string]any) {
		k := headertest.At(m, "keyslots")
		k["1"], k["2"] = k["0"], k["0"]
	}, "keyslots"},
	"token": {func(m map[string]any) {
		headertest.At(m, "tokens")["0"] = map[string]any{"type": "systemd-tpm2", "keyslots": []string{"0"}}
	}, "tokens"},
	"two digests": {func(m map[string]any) {
		d := headertest.At(m, "digests")
		d["1"] = d["0"]
	}, "digests.1"},
	"digest of no keyslot": {func(m map[string]any) { headertest.At(m, "digests", "0")["keyslots"] = []string{} }, "digests.0.keyslots"},
	"requirements": {func(m map[string]any) {
		headertest.At(m, "config")["requirements"] = map[string]any{"mandatory": []string{"orrery-test"}}
	}, "config.requirements"},
	"persistent flags": {func(m map[string]any) { headertest.At(m, "config")["flags"] = []string{"allow-discards"} }, "config.flags"},
	"bigger keyslots area": {func(m map[string]any) {
		headertest.At(m, "config")["keyslots_size"] = "33521664"
	}, "config.keyslots_size"},
	"unknown section": {func(m map[string]any) { m["extra"] = map[string]any{} }, "extra"},
}

func TestCheckMetadata(t *testing.T) {
	v, err := StateDisk.CheckMetadata([]byte(orreryMetadata))
	if err != nil {
		t.Fatalf("Orrery's own header refused: %v", err)
	}
	if want := Authenticated.Volume(""); v != want {
		t.Errorf("CheckMetadata = %+v, want %+v", v, want)
	}
	rekeyed := metadataWith(t, func(m map[string]any) {
		k := headertest.At(m, "keyslots")
		k["1"] = k["0"]
		headertest.At(m, "digests", "0")["keyslots"] = []string{"1", "0"}
	})
	if _, err := StateDisk.CheckMetadata(rekeyed); err != nil {
		t.Errorf("a header with the first-boot and the cluster's keyslot refused: %v", err)
	}

	for name, tc := range tampering {
		t.Run(name, func(t *testing.T) {
			_, err := StateDisk.CheckMetadata(metadataWith(t, tc.edit))
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a FormatError for %s", err, tc.field)
			}
			if fe.Got == "" || fe.Want == "" || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error does not say what it saw and wants: %v", err)
			}
		})
	}
	for name, raw := range map[string]string{
		"not JSON":       "LUKS",
		"null":           "null",
		"array":          "[]",
		"segments array": strings.Replace(orreryMetadata, `"segments":{"0"`, `"segments":[{"0"`, 1),
		"huge":           `{"x":"` + strings.Repeat("a", maxMetadata) + `"}`,
		"float sector":   strings.Replace(orreryMetadata, `"sector_size":4096`, `"sector_size":4096.0`, 1),
		"string sector":  strings.Replace(orreryMetadata, `"sector_size":4096`, `"sector_size":"4096"`, 1),
	} {
		t.Run(name, func(t *testing.T) {
			var fe *FormatError
			if _, err := StateDisk.CheckMetadata([]byte(raw)); !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a FormatError", err)
			}
		})
	}
}

func TestCheckMetadataErrorSaysWhatItSaw(t *testing.T) {
	_, err := StateDisk.CheckMetadata(metadataWith(t, tampering["cipher_null segment"].edit))
	const want = `LUKS2 header: segments.0.encryption is "cipher_null-ecb", want "aes-xts-plain64"`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	long := metadataWith(t, func(m map[string]any) {
		headertest.At(m, "segments", "0")["encryption"] = strings.Repeat("\x1b[2J", 100)
	})
	if _, err := StateDisk.CheckMetadata(long); err == nil || strings.Contains(err.Error(), "\x1b") || len(err.Error()) > 300 {
		t.Errorf("a long, hostile value reaches the console as %q", err)
	}
}

func FuzzCheckMetadata(f *testing.F) {
	f.Add([]byte(orreryMetadata))
	for _, tc := range tampering {
		f.Add(metadataWith(f, tc.edit))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := StateDisk.CheckMetadata(raw)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("not a FormatError: %v", err)
			}
			return
		}
		// What is accepted, the lenient reader (Inspect) sees the same.
		got, err := parseMetadata(raw)
		if err != nil || got != v || !Authenticated.Matches(v) {
			t.Fatalf("accepted %q as %+v; Inspect reads %+v, %v", raw, v, got, err)
		}
	})
}

// requireCryptsetup skips without cryptsetup.
func requireCryptsetup(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Skip("cryptsetup not installed (Debian package cryptsetup-bin; make deps)")
	}
}

// encryptedOnly is StateDisk without integrity: what a host without
// device-mapper can format.
var encryptedOnly = func() Header {
	h := StateDisk
	h.Format = EncryptedOnly
	return h
}()

// formatStateDisk formats a 32 MiB file as the initrd formats a state
// disk, but without integrity, which needs device-mapper: encryptedOnly.
func formatStateDisk(t *testing.T, key string) string {
	t.Helper()
	requireCryptsetup(t)
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(disk, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := encryptedOnly.FormatOpts()
	opts.Label, opts.UUID = "orrery-state", "0b6e1a52-6f7c-4f0e-9d7e-3c1f2a4b5c6d"
	var tool Tool
	if err := tool.FormatLUKS2(context.Background(), disk, key, opts); err != nil {
		t.Fatal(err)
	}
	return disk
}

func keyFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(content), 0o400); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckHeaderOnFile formats a header as the initrd does, with the
// real cryptsetup, and tampers with it as a host can: each change is
// refused, naming the field.
func TestCheckHeaderOnFile(t *testing.T) {
	key := keyFile(t, "0123456789abcdef0123456789abcdef")
	newKey := keyFile(t, "fedcba9876543210fedcba9876543210")
	t.Run("formatted header accepted", func(t *testing.T) { checkFormattedHeaderAccepted(t, key) })
	t.Run("re-keyed header accepted", func(t *testing.T) { checkRekeyedHeaderAccepted(t, key, newKey) })
	for name, tc := range tamperedHeaderCases(key) {
		t.Run(name, func(t *testing.T) { checkTamperedHeaderRefused(t, key, newKey, tc) })
	}
}

func checkFormattedHeaderAccepted(t *testing.T, key string) {
	ctx := context.Background()
	var tool Tool
	disk := formatStateDisk(t, key)
	v, err := tool.CheckHeader(ctx, disk, encryptedOnly)
	if err != nil {
		t.Fatalf("a header formatted with StateDisk's options (without integrity) refused: %v", err)
	}
	if want := EncryptedOnly.Volume("0b6e1a52-6f7c-4f0e-9d7e-3c1f2a4b5c6d"); v != want {
		t.Errorf("CheckHeader = %+v, want %+v", v, want)
	}
	if _, err := tool.CheckHeader(ctx, disk, StateDisk); err == nil {
		t.Error("a header without integrity passed as a state disk's")
	}
	headertest.Rewrite(t, disk, headertest.AddIntegrity)
	if _, err := tool.CheckHeader(ctx, disk, StateDisk); err != nil {
		t.Fatalf("a state disk's header refused: %v", err)
	}
}

func checkRekeyedHeaderAccepted(t *testing.T, key, newKey string) {
	ctx := context.Background()
	var tool Tool
	// As bootstrapperd re-keys it: both keyslots, then the new one.
	rekeyed := formatStateDisk(t, key)
	if err := tool.AddKey(ctx, rekeyed, key, newKey); err != nil {
		t.Fatal(err)
	}
	if _, err := tool.CheckHeader(ctx, rekeyed, encryptedOnly); err != nil {
		t.Errorf("a header with the first-boot and the cluster's keyslot refused: %v", err)
	}
	if err := tool.RemoveKey(ctx, rekeyed, key); err != nil {
		t.Fatal(err)
	}
	if _, err := tool.CheckHeader(ctx, rekeyed, encryptedOnly); err != nil {
		t.Errorf("a re-keyed header refused: %v", err)
	}
	// As bootstrapperd records the owner's access key (the binary
	// header's subsystem field, outside the checked JSON).
	field := strings.Repeat("A", 43)
	if err := tool.SetSubsystem(ctx, rekeyed, field); err != nil {
		t.Fatal(err)
	}
	if got, err := tool.Subsystem(ctx, rekeyed); err != nil || got != field {
		t.Errorf("Subsystem = %q, %v; want %q", got, err, field)
	}
	if _, err := tool.CheckHeader(ctx, rekeyed, encryptedOnly); err != nil {
		t.Errorf("a header with a subsystem refused: %v", err)
	}
}

type tamperedHeaderCase struct {
	// before runs cryptsetup on the formatted disk.
	before []string
	edit   func(m map[string]any)
	field  string
}

// tamperedHeaderCases are the changes a host can make to a state disk's
// header, each with the field CheckHeader must name; key is the
// first-boot key file the disk is formatted with.
func tamperedHeaderCases(key string) map[string]tamperedHeaderCase {
	return map[string]tamperedHeaderCase{
		"cipher_null segment": {edit: tampering["cipher_null segment"].edit, field: "segments.0.encryption"},
		"no integrity":        {edit: tampering["no integrity"].edit, field: "segments.0.integrity"},
		"token": {
			before: []string{"token", "import"}, // the token's JSON on stdin
			field:  "tokens",
		},
		"argon2id keyslot": {
			before: []string{"luksAddKey", "--batch-mode", "--key-file", key, "--pbkdf", "argon2id",
				"--pbkdf-force-iterations", "4", "--pbkdf-memory", "32", "--pbkdf-parallel", "1"},
			field: "keyslots.1.kdf.type",
		},
		"cipher_null keyslot": {edit: tampering["cipher_null keyslot"].edit, field: "keyslots.0.area.encryption"},
		"requirements":        {edit: tampering["requirements"].edit, field: "config.requirements"},
	}
}

func checkTamperedHeaderRefused(t *testing.T, key, newKey string, tc tamperedHeaderCase) {
	ctx := context.Background()
	var tool Tool
	disk := formatStateDisk(t, key)
	if tc.before != nil {
		args := append(append([]string{}, tc.before...), disk)
		if tc.before[0] == "luksAddKey" {
			args = append(args, newKey)
		}
		cmd := exec.Command("cryptsetup", args...)
		cmd.Stdin = strings.NewReader(`{"type":"orrery-test","keyslots":["0"]}`)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cryptsetup %s: %v: %s", tc.before[0], err, out)
		}
	}
	headertest.Rewrite(t, disk, func(m map[string]any) {
		headertest.AddIntegrity(m)
		if tc.edit != nil {
			tc.edit(m)
		}
	})
	// cryptsetup still reads the header: only Orrery's check refuses it.
	if out, err := exec.Command("cryptsetup", "luksDump", disk).CombinedOutput(); err != nil {
		t.Fatalf("cryptsetup refuses the tampered header itself: %v: %s", err, out)
	}
	_, err := tool.CheckHeader(ctx, disk, StateDisk)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Field != tc.field {
		t.Fatalf("CheckHeader = %v, want a FormatError for %s", err, tc.field)
	}
	if !strings.Contains(err.Error(), "LUKS2 header of "+disk) {
		t.Errorf("error does not name the disk: %v", err)
	}
	t.Logf("refused: %v", err)
}

// TestSaveHeaderOnFile: the copy is checked and opens with the disk's
// key; a tampered disk leaves no copy. (Opening a mapping needs
// device-mapper: the initrd's VM tests do it.)
func TestSaveHeaderOnFile(t *testing.T) {
	ctx := context.Background()
	key := keyFile(t, "0123456789abcdef0123456789abcdef")
	var tool Tool
	disk := formatStateDisk(t, key)
	copyPath := filepath.Join(t.TempDir(), "header")
	v, err := tool.SaveHeader(ctx, disk, copyPath, encryptedOnly)
	if err != nil {
		t.Fatal(err)
	}
	if v.UUID != "0b6e1a52-6f7c-4f0e-9d7e-3c1f2a4b5c6d" {
		t.Errorf("SaveHeader = %+v", v)
	}
	if fi, err := os.Stat(copyPath); err != nil || fi.Size() != encryptedOnly.DataOffset || fi.Mode().Perm() != 0o600 {
		t.Fatalf("copy: %v, %v", fi, err)
	}
	if ok, err := tool.TestKeyWithHeader(ctx, disk, copyPath, key); err != nil || !ok {
		t.Errorf("the key does not open the disk with the copy: %v, %v", ok, err)
	}
	other := keyFile(t, "fedcba9876543210fedcba9876543210")
	if ok, err := tool.TestKeyWithHeader(ctx, disk, copyPath, other); err != nil || ok {
		t.Errorf("another key opens the disk with the copy: %v, %v", ok, err)
	}
	// The copy is what counts: the disk's own header no longer matters.
	if err := os.WriteFile(disk, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if ok, err := tool.TestKeyWithHeader(ctx, disk, copyPath, key); err != nil || !ok {
		t.Errorf("the copy depends on the disk's header: %v, %v", ok, err)
	}
	if _, err := tool.SaveHeader(ctx, disk, copyPath, encryptedOnly); err == nil {
		t.Error("SaveHeader overwrote an existing file")
	}

	tampered := formatStateDisk(t, key)
	headertest.Rewrite(t, tampered, tampering["cipher_null segment"].edit)
	path := filepath.Join(t.TempDir(), "header")
	_, err = tool.SaveHeader(ctx, tampered, path, encryptedOnly)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Field != "segments.0.encryption" || !strings.Contains(err.Error(), tampered) {
		t.Errorf("SaveHeader(tampered) = %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused header's copy is left: %v", err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := tool.SaveHeader(ctx, short, filepath.Join(t.TempDir(), "h"), encryptedOnly); err == nil || !strings.Contains(err.Error(), "less than") {
		t.Errorf("SaveHeader(1 MiB disk) = %v", err)
	}
}
