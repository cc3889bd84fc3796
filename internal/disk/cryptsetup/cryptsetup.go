// Package cryptsetup runs Debian's cryptsetup and veritysetup (package
// cryptsetup-bin), and dmsetup to read what the kernel mapped: the one
// place where Orrery executes them. Consumers declare the small interface
// they need and take a *Tool.
//
// Keys are always passed in key files, never on a command line, and no
// method logs anything: errors carry the tool's own error output, which
// never contains key material (device-mapper tables are read without
// --showkeys, and their key field never reaches an error).
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

// Tool runs cryptsetup, veritysetup and dmsetup. The zero value looks
// them up in PATH.
type Tool struct {
	// Cryptsetup, Veritysetup and Dmsetup are the executables; empty
	// means "cryptsetup", "veritysetup" and "dmsetup" in PATH.
	Cryptsetup, Veritysetup, Dmsetup string
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
// header's name: cryptsetup's --integrity name, the size of the
// integrity key that cryptsetup appends to the cipher's key, and the
// size of a sector's tag (which the device-mapper table shows).
var integrityAlgs = map[string]struct {
	arg      string
	keyBits  int
	tagBytes int
}{"hmac(sha256)": {"hmac-sha256", 256, 32}}

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
	// Hash, if set, is the PBKDF's and the anti-forensic splitter's hash.
	Hash string
	// SectorSize, if > 0, is the encryption sector size in bytes; zero
	// means 4096 with integrity (one tag per page, not eight) and
	// cryptsetup's choice without.
	SectorSize int
	// DataOffset, if > 0, is where the data starts, in bytes (a multiple
	// of 512); zero means after the default header area, aligned as
	// cryptsetup sees fit for the disk.
	DataOffset int64
	// KeyslotCipher and KeyslotKeyBits, if set, encrypt the keyslot
	// area; empty means cryptsetup's choice.
	KeyslotCipher  string
	KeyslotKeyBits int
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
		integrity = []string{"--integrity", alg.arg, "--integrity-no-wipe"}
	}
	args := append([]string{"luksFormat", "--batch-mode", "--type", "luks2",
		"--cipher", f.Cipher, "--key-size", strconv.Itoa(cipherBits), "--key-file", keyFile}, integrity...)
	switch {
	case o.SectorSize > 0:
		args = append(args, "--sector-size", strconv.Itoa(o.SectorSize))
	case f.Integrity != "":
		// 4 KiB sectors: one tag per page, not eight.
		args = append(args, "--sector-size", "4096")
	}
	if o.DataOffset > 0 {
		if o.DataOffset%512 != 0 {
			return fmt.Errorf("format %s: a data offset of %d bytes is not a whole number of 512-byte sectors", dev, o.DataOffset)
		}
		args = append(args, "--offset", strconv.FormatInt(o.DataOffset/512, 10))
	}
	// cryptsetup (2.6.1 and later) refuses to set a keyslot's cipher on a
	// volume with integrity; it then uses the data cipher's, which is
	// what StateDisk wants and CheckMetadata checks.
	if o.KeyslotCipher != "" && f.Integrity == "" {
		args = append(args, "--keyslot-cipher", o.KeyslotCipher)
	}
	if o.KeyslotKeyBits > 0 && f.Integrity == "" {
		args = append(args, "--keyslot-key-size", strconv.Itoa(o.KeyslotKeyBits))
	}
	if o.Hash != "" {
		args = append(args, "--hash", o.Hash)
	}
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
// with the contents of keyFile. It trusts dev's header: for a disk the
// host controls, use OpenChecked.
func (t *Tool) OpenLUKS(ctx context.Context, dev, name, keyFile string) error {
	_, err := t.run(ctx, t.cryptsetup(), "open", "--type", "luks", "--key-file", keyFile, dev, name)
	return err
}

// OpenChecked maps the LUKS2 volume on dev as /dev/mapper/<name>,
// unlocked with the contents of keyFile, taking its header from the file
// header (a copy SaveHeader checked against h), and checks that the
// kernel's mapping is what h's data segment makes (CheckMapping). A
// mapping that differs is closed again, and the error is a *FormatError.
func (t *Tool) OpenChecked(ctx context.Context, dev, header, name, keyFile string, h Header) error {
	if header == "" {
		return errors.New("open a LUKS2 volume with a checked header: no header file")
	}
	if _, err := t.run(ctx, t.cryptsetup(), "open", "--type", "luks2", "--header", header, "--key-file", keyFile, dev, name); err != nil {
		return err
	}
	if err := t.CheckMapping(ctx, name, h); err != nil {
		if cerr := t.Close(ctx, name); cerr != nil {
			return errors.Join(err, fmt.Errorf("close the refused mapping: %w", cerr))
		}
		return err
	}
	return nil
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
func parseLabel(dump []byte) (string, error) { return dumpField(dump, "Label:", "(no label)") }

// SetSubsystem sets the LUKS2 subsystem field of dev (at most 47 bytes).
func (t *Tool) SetSubsystem(ctx context.Context, dev, subsystem string) error {
	_, err := t.run(ctx, t.cryptsetup(), "config", "--subsystem", subsystem, dev)
	return err
}

// Subsystem returns the LUKS2 subsystem field of dev; "" for none.
func (t *Tool) Subsystem(ctx context.Context, dev string) (string, error) {
	out, err := t.run(ctx, t.cryptsetup(), "luksDump", dev)
	if err != nil {
		return "", err
	}
	return dumpField(out, "Subsystem:", "(no subsystem)")
}

// dumpField reads a line of 'cryptsetup luksDump' that starts with name;
// none means the field is empty.
func dumpField(dump []byte, name, none string) (string, error) {
	for _, line := range strings.Split(string(dump), "\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			v = strings.TrimSpace(v)
			if v == none {
				return "", nil
			}
			return v, nil
		}
	}
	return "", fmt.Errorf("luksDump shows no %q line", name)
}

// AddKey adds a keyslot for the key in newKeyFile, authorised by the key
// in keyFile. The new keyslot is one StateDisk allows, like the first
// one: PBKDF2 with few iterations (keys are 32 random bytes, so a slow
// derivation buys nothing), its area encrypted with AES-XTS.
func (t *Tool) AddKey(ctx context.Context, dev, keyFile, newKeyFile string) error {
	h := StateDisk
	_, err := t.run(ctx, t.cryptsetup(), "luksAddKey", "--batch-mode", "--key-file", keyFile,
		// No --keyslot-cipher: cryptsetup refuses it on a volume with
		// integrity, and the new keyslot gets the data cipher's, which
		// CheckMetadata checks.
		"--pbkdf", h.PBKDF, "--pbkdf-force-iterations", strconv.Itoa(h.Iterations), "--hash", h.Hash, dev, newKeyFile)
	return err
}

// RemoveKey removes the keyslot that the key in keyFile opens.
func (t *Tool) RemoveKey(ctx context.Context, dev, keyFile string) error {
	_, err := t.run(ctx, t.cryptsetup(), "luksRemoveKey", "--batch-mode", dev, keyFile)
	return err
}

// TestKey reports whether the key in keyFile opens dev, without opening it.
func (t *Tool) TestKey(ctx context.Context, dev, keyFile string) (bool, error) {
	return t.TestKeyWithHeader(ctx, dev, "", keyFile)
}

// TestKeyWithHeader reports whether the key in keyFile opens dev, whose
// header is read from the file header ("" for dev's own), without
// opening it.
func (t *Tool) TestKeyWithHeader(ctx context.Context, dev, header, keyFile string) (bool, error) {
	args := []string{"open", "--test-passphrase", "--key-file", keyFile}
	if header != "" {
		args = append(args, "--type", "luks2", "--header", header)
	}
	_, err := t.run(ctx, t.cryptsetup(), append(args, dev)...)
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

func (t *Tool) dmsetup() string {
	if t.Dmsetup != "" {
		return t.Dmsetup
	}
	return "dmsetup"
}

// maxOutput bounds what run keeps of a tool's output: what the tools
// print about a header comes from the disk, which the host may have
// written.
const maxOutput = 1 << 20

// capped keeps the first maxOutput bytes written to it.
type capped struct {
	bytes.Buffer
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := maxOutput - c.Len(); len(p) > room {
		c.over = true
		c.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.Buffer.Write(p)
}

// run runs bin with args; the error wraps the exit status and carries the
// tool's error output.
func (t *Tool) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	var stdout, stderr capped
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil && stdout.over {
		return nil, fmt.Errorf("%s %s: more than %d bytes of output", bin, args[0], maxOutput)
	}
	if err != nil {
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
