package rekey

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/owneraccess"
)

// newDisk formats a real LUKS2 volume on a file, as the initrd does on a
// blank state disk, with a first-boot passphrase file beside it.
func newDisk(t *testing.T) *Disk {
	t.Helper()
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Fatal("cryptsetup not installed (Debian package cryptsetup-bin): run make deps")
	}
	dir := t.TempDir()
	dev := filepath.Join(dir, "state.img")
	if err := os.WriteFile(dev, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	first := filepath.Join(dir, "run", "first-boot-key")
	os.MkdirAll(filepath.Dir(first), 0o700)
	if err := os.WriteFile(first, bytes.Repeat([]byte{7}, 32), 0o400); err != nil {
		t.Fatal(err)
	}
	tool := &cryptsetup.Tool{}
	if err := tool.FormatLUKS2(context.Background(), dev, first, cryptsetup.FormatOpts{Format: cryptsetup.EncryptedOnly, PBKDF: "pbkdf2", Iterations: 1000, UUID: formattedUUID}); err != nil {
		t.Fatal(err)
	}
	// What the initrd records after formatting. This host's kernel may
	// lack device-mapper, which cryptsetup needs to format dm-integrity:
	// the volume here has none.
	d := &Disk{LUKS: tool, Device: dev, FirstBootKey: first, TmpDir: filepath.Join(dir, "run"), Format: cryptsetup.EncryptedOnly,
		VolumeRecord: filepath.Join(dir, "first-boot-volume.json")}
	writeRecord(t, d, cryptsetup.EncryptedOnly.Volume(formattedUUID))
	return d
}

func writeRecord(t *testing.T, d *Disk, v cryptsetup.Volume) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.VolumeRecord, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

const formattedUUID = "5f0c2d1e-8a4b-4c3d-9e2f-1a2b3c4d5e6f"

func opens(t *testing.T, d *Disk, key []byte) bool {
	t.Helper()
	f := filepath.Join(t.TempDir(), "k")
	os.WriteFile(f, key, 0o400)
	ok, err := d.LUKS.TestKey(context.Background(), d.Device, f)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestRekey(t *testing.T) {
	d := newDisk(t)
	ctx := context.Background()
	uuid, err := d.UUID(ctx)
	if err != nil || len(uuid) != 36 {
		t.Fatalf("UUID = %q, %v", uuid, err)
	}
	derived := bytes.Repeat([]byte{9}, 32)
	if err := d.Rekey(ctx, derived); err != nil {
		t.Fatalf("Rekey: %v", err)
	}
	if !opens(t, d, derived) {
		t.Fatal("the derived key does not open the disk")
	}
	if opens(t, d, bytes.Repeat([]byte{7}, 32)) {
		t.Fatal("the first-boot passphrase still opens the disk")
	}
	if _, err := os.Stat(d.FirstBootKey); !os.IsNotExist(err) {
		t.Fatal("the first-boot passphrase file is still there")
	}
	// A later boot's initrd must take the disk for a cluster's.
	if label, err := d.LUKS.(*cryptsetup.Tool).Label(ctx, d.Device); err != nil || label != handoff.KeyedLabel {
		t.Fatalf("LUKS2 label after Rekey = %q, %v; want %q", label, err, handoff.KeyedLabel)
	}
	entries, _ := os.ReadDir(d.TmpDir)
	if len(entries) != 0 {
		t.Fatalf("staged key files left in %s: %v", d.TmpDir, entries)
	}
	// The initrd of a later boot finds the owner's key in the header.
	owner := ed25519.PublicKey(bytes.Repeat([]byte{3}, 32))
	if err := d.RecordOwner(ctx, owner); err != nil {
		t.Fatal(err)
	}
	field, err := d.LUKS.(*cryptsetup.Tool).Subsystem(ctx, d.Device)
	if got, ferr := owneraccess.FromHeaderField(field); err != nil || ferr != nil || !got.Equal(owner) {
		t.Fatalf("owner's key in the header: %q (%v, %v)", field, err, ferr)
	}
	// A retry after success is a no-op.
	if err := d.Rekey(ctx, derived); err != nil {
		t.Fatalf("second Rekey: %v", err)
	}
	// Another cluster's key cannot take over the disk.
	err = d.Rekey(ctx, bytes.Repeat([]byte{1}, 32))
	if err == nil || !strings.Contains(err.Error(), "belongs to another cluster") {
		t.Fatalf("rekey with a foreign key: %v", err)
	}
}

func TestRekeyFinishesAnInterruptedRekey(t *testing.T) {
	d := newDisk(t)
	ctx := context.Background()
	derived := bytes.Repeat([]byte{9}, 32)
	// Interrupted after adding the new key: both keys open the disk.
	kf := filepath.Join(t.TempDir(), "k")
	os.WriteFile(kf, derived, 0o400)
	if err := d.LUKS.AddKey(ctx, d.Device, d.FirstBootKey, kf); err != nil {
		t.Fatal(err)
	}
	if err := d.Rekey(ctx, derived); err != nil {
		t.Fatal(err)
	}
	if !opens(t, d, derived) || opens(t, d, bytes.Repeat([]byte{7}, 32)) {
		t.Fatal("interrupted re-key not finished")
	}
}

// swapIn replaces the state disk's content with a LUKS2 volume formatted
// by someone else (cryptsetup luksFormat with args), opened by key: what
// a host that swaps the disk after the initrd ran can present.
func swapIn(t *testing.T, d *Disk, key []byte, args ...string) {
	t.Helper()
	if err := os.WriteFile(d.Device, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	kf := filepath.Join(t.TempDir(), "k")
	os.WriteFile(kf, key, 0o400)
	args = append([]string{"luksFormat", "--batch-mode", "--type", "luks2", "--key-file", kf,
		"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"}, args...)
	if out, err := exec.Command("cryptsetup", append(args, d.Device)...).CombinedOutput(); err != nil {
		t.Fatalf("luksFormat: %v: %s", err, out)
	}
}

func header(t *testing.T, d *Disk) []byte {
	t.Helper()
	out, err := exec.Command("cryptsetup", "luksDump", "--dump-json-metadata", d.Device).Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRekeyOnlyTheVolumeTheInitrdFormatted(t *testing.T) {
	derived := bytes.Repeat([]byte{9}, 32)
	tests := map[string]struct {
		prepare func(t *testing.T, d *Disk)
		wantIs  error
	}{
		// The derived key is bound to the UUID the node reports; a host
		// that swaps in another admitted node's disk makes the join
		// service hand out a key that opens it.
		"another node's disk that the derived key opens": {
			prepare: func(t *testing.T, d *Disk) { swapIn(t, d, derived) },
			wantIs:  ErrWrongVolume,
		},
		"the recorded UUID with a weak cipher": {
			prepare: func(t *testing.T, d *Disk) {
				swapIn(t, d, derived, "--uuid", formattedUUID, "--cipher", "aes-cbc-essiv:sha256", "--key-size", "128")
			},
			wantIs: ErrWrongVolume,
		},
		"the recorded UUID with a short key": {
			prepare: func(t *testing.T, d *Disk) {
				swapIn(t, d, derived, "--uuid", formattedUUID, "--cipher", cryptsetup.EncryptedOnly.Cipher, "--key-size", "256")
			},
			wantIs: ErrWrongVolume,
		},
		// The host keeps the recorded UUID and cipher but drops the
		// per-sector tags, so it can roll sectors back unnoticed.
		"the recorded volume without integrity": {
			prepare: func(t *testing.T, d *Disk) {
				d.Format = cryptsetup.Authenticated
				writeRecord(t, d, cryptsetup.Authenticated.Volume(formattedUUID))
				swapIn(t, d, derived, "--uuid", formattedUUID)
			},
			wantIs: ErrWrongVolume,
		},
		"a volume the first-boot passphrase does not open": {
			prepare: func(t *testing.T, d *Disk) { swapIn(t, d, bytes.Repeat([]byte{3}, 32)) },
			wantIs:  ErrWrongVolume,
		},
		"no record of the formatted volume": {
			prepare: func(t *testing.T, d *Disk) {
				swapIn(t, d, derived)
				os.Remove(d.VolumeRecord)
			},
			wantIs: fs.ErrNotExist,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDisk(t)
			tc.prepare(t, d)
			before := header(t, d)
			err := d.Rekey(context.Background(), derived)
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("Rekey = %v, want %v", err, tc.wantIs)
			}
			if _, err := os.Stat(d.FirstBootKey); err != nil {
				t.Errorf("the first-boot passphrase file is gone, though it still opens the node's real state volume: %v", err)
			}
			if !bytes.Equal(header(t, d), before) {
				t.Error("Rekey changed the keyslots of a volume it refused")
			}
			if tc.wantIs == ErrWrongVolume { //nolint:errorlint // which sentinel the case wants, not an error
				if _, err := d.UUID(context.Background()); !errors.Is(err, ErrWrongVolume) {
					t.Errorf("UUID = %v, want ErrWrongVolume: the disk key would be bound to the wrong volume", err)
				}
			}
		})
	}
}
