package vmtest

import (
	"bytes"
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup/headertest"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/keys"
)

// joinCluster stands in for bootstrapperd at the node's first join, on
// the state disk that a first boot (console) left in the VM directory
// dir: the test root reported that boot's passphrase and volume record,
// and wrote a measurement salt where bootstrapperd keeps it. On the host,
// with the cryptsetup package as bootstrapperd re-keys a disk, it adds
// the key ms gives for the disk's UUID, marks the disk keyed to a cluster
// and removes the first-boot passphrase. It returns the disk's UUID and
// the salt.
//
// The initrd under test formats the disk, at the first boot: a host
// without device-mapper cannot format dm-integrity, and the filesystem
// must be written through it (a sector never written reads as an I/O
// error), so neither can be made here.
func joinCluster(t *testing.T, dir, console string, ms keys.MasterSecret) (uuid string, salt []byte) {
	t.Helper()
	passphrase := rootHex(t, console, "firstbootkey")
	salt = rootHex(t, console, "salt")
	volumes := rootReports(console, "volume")
	if len(volumes) != 1 {
		t.Fatalf("the test root reported %d volume records, want 1\n%s", len(volumes), consoleReport(console))
	}
	var record cryptsetup.Volume
	if err := json.Unmarshal([]byte(volumes[0]), &record); err != nil {
		t.Fatalf("volume record %q: %v", volumes[0], err)
	}
	work := t.TempDir()
	raw := filepath.Join(work, "state.raw")
	disk := filepath.Join(dir, vm.StateFile)
	if err := run("qemu-img", "convert", "-O", "raw", disk, raw); err != nil {
		t.Fatal(err)
	}
	uuid = rekey(t, raw, record, passphrase, ms)
	keyed := filepath.Join(work, vm.StateFile)
	if err := run("qemu-img", "convert", "-O", "qcow2", raw, keyed); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(keyed, disk); err != nil {
		t.Fatal(err)
	}
	return uuid, salt
}

// rekey re-keys the LUKS2 volume in the image raw, which the first boot
// recorded as record, as bootstrapperd does: from the first-boot
// passphrase to the disk key ms gives for its UUID, then labelled keyed.
// It checks the header before and after against cryptsetup.StateDisk
// (what every later boot accepts), and returns the UUID.
func rekey(t *testing.T, raw string, record cryptsetup.Volume, passphrase []byte, ms keys.MasterSecret) string {
	t.Helper()
	ctx := context.Background()
	tool := &cryptsetup.Tool{}
	vol, err := tool.CheckHeader(ctx, raw, cryptsetup.StateDisk)
	if err != nil {
		t.Fatalf("the first boot's state disk: %v", err)
	}
	// bootstrapperd re-keys only the volume the initrd recorded.
	if vol != record {
		t.Fatalf("the state disk is %+v, the first boot recorded %+v", vol, record)
	}
	if label, err := tool.Label(ctx, raw); err != nil || label != handoff.FirstBootLabel {
		t.Fatalf("the first boot's state disk has label %q (%v), want %q", label, err, handoff.FirstBootLabel)
	}
	diskKey, err := ms.DiskKey(vol.UUID)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	firstKey, clusterKey := filepath.Join(dir, "first-boot-key"), filepath.Join(dir, "disk-key")
	for f, k := range map[string][]byte{firstKey: passphrase, clusterKey: diskKey} {
		if err := os.WriteFile(f, k, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	if err := tool.AddKey(ctx, raw, firstKey, clusterKey); err != nil {
		t.Fatalf("add the cluster's disk key (cryptsetup.Tool.AddKey, as bootstrapperd does): %v", err)
	}
	if err := tool.SetLabel(ctx, raw, handoff.KeyedLabel); err != nil {
		t.Fatalf("mark the disk keyed: %v", err)
	}
	if err := tool.RemoveKey(ctx, raw, firstKey); err != nil {
		t.Fatalf("remove the first-boot passphrase: %v", err)
	}
	after, err := tool.CheckHeader(ctx, raw, cryptsetup.StateDisk)
	if err != nil || after != vol {
		t.Fatalf("the re-keyed state disk: %+v, %v; want %+v", after, err, vol)
	}
	for f, want := range map[string]bool{clusterKey: true, firstKey: false} {
		if ok, err := tool.TestKey(ctx, raw, f); err != nil || ok != want {
			t.Fatalf("%s opens the re-keyed disk: %t (%v), want %t", filepath.Base(f), ok, err, want)
		}
	}
	return vol.UUID
}

// rootHex is the one value, hex, that the test root reported for key.
func rootHex(t *testing.T, console, key string) []byte {
	t.Helper()
	got := rootReports(console, key)
	if len(got) != 1 {
		t.Fatalf("the test root reported %d values of %s, want 1\n%s", len(got), key, consoleReport(console))
	}
	b, err := hex.DecodeString(got[0])
	if err != nil {
		t.Fatalf("the test root's %s: %v", key, err)
	}
	return b
}

// TestRekeyOnTheHost runs rekey, without a VM, on a header like the one
// a first boot writes. The host cannot format dm-integrity, so the header
// is formatted without it and then given the integrity fields
// (headertest), the digest of a 96-byte volume key, and a keyslot for
// the first-boot passphrase that cryptsetup adds with that key. rekey
// reads nothing of the data area, so it does here what it does to a
// first boot's disk in the VM tests, and what bootstrapperd does to a
// node's disk at its first join.
func TestRekeyOnTheHost(t *testing.T) {
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Skip("cryptsetup not installed (make deps)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	raw := filepath.Join(dir, "state.raw")
	if err := os.WriteFile(raw, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	passphrase := bytes.Repeat([]byte{7}, 32)
	volumeKey := bytes.Repeat([]byte{9}, cryptsetup.StateDisk.Format.KeyBits/8)
	files := map[string][]byte{"format-key": {1}, "first-boot-key": passphrase, "volume-key": volumeKey}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	opts := cryptsetup.StateDisk.FormatOpts()
	opts.Format, opts.Label = cryptsetup.EncryptedOnly, handoff.FirstBootLabel
	tool := &cryptsetup.Tool{}
	if err := tool.FormatLUKS2(ctx, raw, filepath.Join(dir, "format-key"), opts); err != nil {
		t.Fatal(err)
	}
	headertest.Rewrite(t, raw, func(m map[string]any) {
		headertest.AddIntegrity(m)
		d := headertest.At(m, "digests", "0")
		salt, err := base64.StdEncoding.DecodeString(d["salt"].(string))
		if err != nil {
			t.Fatal(err)
		}
		iterations, err := d["iterations"].(json.Number).Int64()
		if err != nil {
			t.Fatal(err)
		}
		digest, err := pbkdf2.Key(sha256.New, string(volumeKey), salt, int(iterations), sha256.Size)
		if err != nil {
			t.Fatal(err)
		}
		d["digest"] = base64.StdEncoding.EncodeToString(digest)
	})
	// Keyslot 0 holds the 64-byte key it was formatted with; the new one
	// holds the 96-byte key, encrypted as cryptsetup does by default for
	// a volume with integrity (aes-xts-plain64, 512-bit key).
	for _, args := range [][]string{
		{"luksAddKey", "--batch-mode", "--volume-key-file", filepath.Join(dir, "volume-key"), "--pbkdf", "pbkdf2",
			"--pbkdf-force-iterations", "1000", "--hash", "sha256", raw, filepath.Join(dir, "first-boot-key")},
		{"luksKillSlot", "--batch-mode", raw, "0"},
	} {
		if err := run("cryptsetup", args...); err != nil {
			t.Fatal(err)
		}
	}
	record, err := tool.CheckHeader(ctx, raw, cryptsetup.StateDisk)
	if err != nil {
		t.Fatalf("the stand-in for a first boot's header: %v", err)
	}
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if uuid := rekey(t, raw, record, passphrase, ms); uuid != record.UUID {
		t.Errorf("rekey returned UUID %s, want %s", uuid, record.UUID)
	}
	if label, err := tool.Label(ctx, raw); err != nil || label != handoff.KeyedLabel {
		t.Errorf("label %q (%v), want %q", label, err, handoff.KeyedLabel)
	}
}
