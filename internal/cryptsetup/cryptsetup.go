// Package cryptsetup runs Debian's cryptsetup and veritysetup (package
// cryptsetup-bin): the one place where Orrery executes them. Consumers
// declare the small interface they need and take a *Tool.
//
// Keys are always passed in key files, never on a command line, and no
// method logs anything: errors carry the tool's own error output, which
// never contains key material.
package cryptsetup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Tool runs cryptsetup and veritysetup. The zero value looks both up in PATH.
type Tool struct {
	// Cryptsetup and Veritysetup are the executables; empty means
	// "cryptsetup" and "veritysetup" in PATH.
	Cryptsetup, Veritysetup string
}

// Format is how a LUKS2 volume protects its data.
type Format struct {
	Cipher  string // the data encryption, as cryptsetup names it
	KeyBits int    // the volume key's size, integrity key included
	// Integrity is the per-sector authentication as the LUKS2 header names
	// it (e.g. "hmac(sha256)"); empty for none.
	Integrity string
}

var (
	// Authenticated is how Orrery formats state disks: AES-XTS with two
	// 256-bit keys, and an HMAC-SHA256 tag per 4 KiB sector kept by
	// dm-integrity with the 256-bit HMAC key (512+256 bits). XTS alone
	// hides the data but lets whoever holds the disk (the host) flip it to
	// garbage or copy a sector to another place unnoticed; with the tag
	// (keyed, over the data and the sector number), reading such a sector
	// fails with an I/O error. What the tag cannot catch is a sector put
	// back to an older version of itself with its older tag: there is no
	// freshness without state outside the disk.
	Authenticated = Format{Cipher: "aes-xts-plain64", KeyBits: 768, Integrity: "hmac(sha256)"}
	// EncryptedOnly is AES-XTS without integrity: for tests on hosts
	// without device-mapper, where cryptsetup cannot format dm-integrity.
	EncryptedOnly = Format{Cipher: "aes-xts-plain64", KeyBits: 512}
)

// integrityAlgs are the integrity algorithms FormatLUKS2 knows, by the
// header's name: cryptsetup's --integrity name, and the size of the
// integrity key that cryptsetup appends to the cipher's key.
var integrityAlgs = map[string]struct {
	arg     string
	keyBits int
}{"hmac(sha256)": {"hmac-sha256", 256}}

// Matches reports whether v was formatted as f.
func (f Format) Matches(v Volume) bool {
	return v.Cipher == f.Cipher && v.KeyBits == f.KeyBits && v.Integrity == f.Integrity
}

// Volume is the header of a volume formatted as f with uuid.
func (f Format) Volume(uuid string) Volume {
	return Volume{UUID: uuid, Cipher: f.Cipher, KeyBits: f.KeyBits, Integrity: f.Integrity}
}

func (f Format) String() string {
	s := fmt.Sprintf("%s with a %d-bit key", f.Cipher, f.KeyBits)
	if f.Integrity != "" {
		s += ", integrity " + f.Integrity
	}
	return s
}

// FormatOpts are the parameters of a new LUKS2 volume. The zero value is
// Authenticated, a UUID cryptsetup picks, and cryptsetup's default (slow,
// memory-hard) argon2id key derivation.
type FormatOpts struct {
	// Format is the data protection; the zero value means Authenticated.
	Format Format
	// PBKDF is the keyslot's key derivation: "pbkdf2", "argon2id" or
	// "argon2i"; empty means cryptsetup's default.
	PBKDF string
	// Iterations, if > 0, fixes the PBKDF's iteration (time) cost instead
	// of letting cryptsetup benchmark the machine.
	Iterations int
	// MemoryKiB, if > 0, is the memory cost of an argon2 PBKDF.
	MemoryKiB int
	// Label is the LUKS2 label; empty means none.
	Label string
	// UUID is the volume's UUID; empty means a random one. Choosing it
	// lets the caller record which volume it formatted.
	UUID string
}

// IsLUKS reports whether dev starts with a LUKS header. An error means
// cryptsetup could not tell (for example, the device cannot be read).
func (t *Tool) IsLUKS(ctx context.Context, dev string) (bool, error) {
	_, err := t.run(ctx, t.cryptsetup(), "isLuks", dev)
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 {
		// cryptsetup exits 1 for "not a LUKS device" and 4 for I/O errors.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// FormatLUKS2 creates a LUKS2 volume on dev whose first keyslot opens
// with the contents of keyFile. It destroys whatever dev held.
//
// With integrity, the data area is not wiped: writing tags for every
// sector of a large disk takes minutes under emulation. Until a sector is
// first written, reading it fails with an I/O error, so whatever goes on
// the volume must write before it reads (see the initrd's statedisk).
func (t *Tool) FormatLUKS2(ctx context.Context, dev, keyFile string, o FormatOpts) error {
	f := o.Format
	if f == (Format{}) {
		f = Authenticated
	}
	cipherBits := f.KeyBits
	var integrity []string
	if f.Integrity != "" {
		alg, ok := integrityAlgs[f.Integrity]
		if !ok {
			return fmt.Errorf("format %s: integrity %q is not one Orrery formats", dev, f.Integrity)
		}
		cipherBits -= alg.keyBits
		// 4 KiB sectors: one tag per page, not eight.
		integrity = []string{"--integrity", alg.arg, "--integrity-no-wipe", "--sector-size", "4096"}
	}
	args := append([]string{"luksFormat", "--batch-mode", "--type", "luks2",
		"--cipher", f.Cipher, "--key-size", strconv.Itoa(cipherBits), "--key-file", keyFile}, integrity...)
	if o.PBKDF != "" {
		args = append(args, "--pbkdf", o.PBKDF)
	}
	if o.Iterations > 0 {
		args = append(args, "--pbkdf-force-iterations", strconv.Itoa(o.Iterations))
	}
	if o.MemoryKiB > 0 {
		args = append(args, "--pbkdf-memory", strconv.Itoa(o.MemoryKiB))
	}
	if o.Label != "" {
		args = append(args, "--label", o.Label)
	}
	if o.UUID != "" {
		args = append(args, "--uuid", o.UUID)
	}
	_, err := t.run(ctx, t.cryptsetup(), append(args, dev)...)
	return err
}

// OpenLUKS maps the LUKS volume on dev as /dev/mapper/<name>, unlocked
// with the contents of keyFile.
func (t *Tool) OpenLUKS(ctx context.Context, dev, name, keyFile string) error {
	_, err := t.run(ctx, t.cryptsetup(), "open", "--type", "luks", "--key-file", keyFile, dev, name)
	return err
}

// Close removes the mapping /dev/mapper/<name> (LUKS or verity).
func (t *Tool) Close(ctx context.Context, name string) error {
	_, err := t.run(ctx, t.cryptsetup(), "close", name)
	return err
}

// OpenVerity maps dataDev, checked against the hash tree on hashDev and
// rootHash (hex), as the read-only /dev/mapper/<name>. The kernel checks
// every block on read; a block that does not match fails with EIO.
func (t *Tool) OpenVerity(ctx context.Context, dataDev, name, hashDev, rootHash string) error {
	_, err := t.run(ctx, t.veritysetup(), "open", dataDev, name, hashDev, rootHash)
	return err
}

// UUID returns the UUID in the LUKS header of dev.
func (t *Tool) UUID(ctx context.Context, dev string) (string, error) {
	out, err := t.run(ctx, t.cryptsetup(), "luksUUID", dev)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// Volume is what a LUKS2 header says about the volume it protects.
type Volume struct {
	UUID    string `json:"uuid"`
	Cipher  string `json:"cipher"`  // the data segment's encryption, e.g. aes-xts-plain64
	KeyBits int    `json:"keyBits"` // the volume key's size
	// Integrity is the data segment's integrity algorithm; empty for none.
	Integrity string `json:"integrity,omitempty"`
}

// Inspect reads the LUKS2 header of dev. It fails for a LUKS1 header, or
// for a LUKS2 header with other than one encrypted data segment: Orrery
// creates neither.
func (t *Tool) Inspect(ctx context.Context, dev string) (Volume, error) {
	uuid, err := t.UUID(ctx, dev)
	if err != nil {
		return Volume{}, err
	}
	raw, err := t.run(ctx, t.cryptsetup(), "luksDump", "--dump-json-metadata", dev)
	if err != nil {
		return Volume{}, err
	}
	v, err := parseMetadata(raw)
	if err != nil {
		return Volume{}, fmt.Errorf("LUKS2 header of %s: %w", dev, err)
	}
	v.UUID = uuid
	return v, nil
}

// metadata is the part of a LUKS2 header's JSON area that Inspect reads.
type metadata struct {
	Keyslots map[string]struct {
		KeySize int `json:"key_size"`
	} `json:"keyslots"`
	Segments map[string]struct {
		Type       string `json:"type"`
		Encryption string `json:"encryption"`
		Integrity  *struct {
			Type string `json:"type"`
		} `json:"integrity"`
	} `json:"segments"`
}

// parseMetadata reads the output of 'luksDump --dump-json-metadata'. The
// header comes from a disk, which the host could have written.
func parseMetadata(raw []byte) (Volume, error) {
	var m metadata
	if err := json.Unmarshal(raw, &m); err != nil {
		return Volume{}, fmt.Errorf("decode metadata: %w", err)
	}
	if len(m.Segments) != 1 {
		return Volume{}, fmt.Errorf("%d data segments, want 1", len(m.Segments))
	}
	var v Volume
	for _, s := range m.Segments {
		if s.Type != "crypt" {
			return Volume{}, fmt.Errorf("data segment of type %q, want crypt", s.Type)
		}
		v.Cipher = s.Encryption
		if s.Integrity != nil {
			v.Integrity = s.Integrity.Type
		}
	}
	for _, k := range m.Keyslots {
		if k.KeySize <= 0 || k.KeySize > 1024 {
			return Volume{}, fmt.Errorf("keyslot with a volume key of %d bytes", k.KeySize)
		}
		// Every keyslot wraps the same volume key.
		if v.KeyBits != 0 && v.KeyBits != k.KeySize*8 {
			return Volume{}, errors.New("keyslots disagree on the volume key size")
		}
		v.KeyBits = k.KeySize * 8
	}
	if v.KeyBits == 0 {
		return Volume{}, errors.New("no keyslot")
	}
	return v, nil
}

// SetLabel sets the LUKS2 label of dev.
func (t *Tool) SetLabel(ctx context.Context, dev, label string) error {
	_, err := t.run(ctx, t.cryptsetup(), "config", "--label", label, dev)
	return err
}

// Label returns the LUKS2 label of dev; "" for none.
func (t *Tool) Label(ctx context.Context, dev string) (string, error) {
	out, err := t.run(ctx, t.cryptsetup(), "luksDump", dev)
	if err != nil {
		return "", err
	}
	return parseLabel(out)
}

// parseLabel reads the "Label:" line of 'cryptsetup luksDump'.
func parseLabel(dump []byte) (string, error) {
	for _, line := range strings.Split(string(dump), "\n") {
		if v, ok := strings.CutPrefix(line, "Label:"); ok {
			v = strings.TrimSpace(v)
			if v == "(no label)" {
				return "", nil
			}
			return v, nil
		}
	}
	return "", errors.New("luksDump shows no label line")
}

// AddKey adds a keyslot for the key in newKeyFile, authorised by the key
// in keyFile. The new keyslot uses PBKDF2 with few iterations, like the
// first one: keys are 32 random bytes, so a slow derivation buys nothing.
func (t *Tool) AddKey(ctx context.Context, dev, keyFile, newKeyFile string) error {
	_, err := t.run(ctx, t.cryptsetup(), "luksAddKey", "--batch-mode", "--key-file", keyFile,
		"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", dev, newKeyFile)
	return err
}

// RemoveKey removes the keyslot that the key in keyFile opens.
func (t *Tool) RemoveKey(ctx context.Context, dev, keyFile string) error {
	_, err := t.run(ctx, t.cryptsetup(), "luksRemoveKey", "--batch-mode", dev, keyFile)
	return err
}

// TestKey reports whether the key in keyFile opens dev, without opening it.
func (t *Tool) TestKey(ctx context.Context, dev, keyFile string) (bool, error) {
	_, err := t.run(ctx, t.cryptsetup(), "open", "--test-passphrase", "--key-file", keyFile, dev)
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 2 {
		// Exit code 2: no keyslot opens with this key.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

func (t *Tool) cryptsetup() string {
	if t.Cryptsetup != "" {
		return t.Cryptsetup
	}
	return "cryptsetup"
}

func (t *Tool) veritysetup() string {
	if t.Veritysetup != "" {
		return t.Veritysetup
	}
	return "veritysetup"
}

// run runs bin with args; the error wraps the exit status and carries the
// tool's error output.
func (t *Tool) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if msg != "" {
			return nil, fmt.Errorf("%s %s: %w: %s", bin, args[0], err, msg)
		}
		return nil, fmt.Errorf("%s %s: %w", bin, args[0], err)
	}
	return stdout.Bytes(), nil
}
