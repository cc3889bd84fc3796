package pcrpredict

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/orrery-dev/orrery/internal/imagebuild/uki"
)

func TestReplay(t *testing.T) {
	d := sha256.Sum256([]byte("x"))
	zero := make([]byte, 32)
	once := Extend(zero, d[:])
	want := Extend(once, d[:])
	got := Replay([]Event{{PCR: 7, Digest: d[:]}, {PCR: 7, Digest: d[:]}})
	if !bytes.Equal(got[7], want) || len(got) != 1 {
		t.Errorf("Replay() = %x, want PCR 7 = %x only", got, want)
	}
}

// TestPCR11MatchesSystemdMeasure checks the section and phase measurements
// against systemd's own calculator (systemd 252's systemd-measure).
func TestPCR11MatchesSystemdMeasure(t *testing.T) {
	const tool = "/lib/systemd/systemd-measure"
	if _, err := os.Stat(tool); err != nil {
		t.Skipf("no %s (Debian package systemd): %v", tool, err)
	}
	dir := t.TempDir()
	sections := map[string][]byte{
		uki.Linux:   bytes.Repeat([]byte("kernel"), 1000),
		uki.OSRel:   []byte("ID=orrery\n"),
		uki.Cmdline: []byte("console=ttyS0 orrery.roothash=00"),
		uki.Initrd:  bytes.Repeat([]byte("initrd"), 700),
	}
	args := []string{"calculate", "--bank=sha256", "--json=short", "--phase=enter-initrd:leave-initrd"}
	for name, data := range sections {
		path := filepath.Join(dir, name[1:])
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--"+name[1:]+"="+path)
	}
	out, err := exec.Command(tool, args...).Output()
	if err != nil {
		t.Fatalf("systemd-measure: %v", err)
	}
	var res struct {
		SHA256 []struct {
			Phase string `json:"phase"`
			PCR   int    `json:"pcr"`
			Hash  string `json:"hash"`
		} `json:"sha256"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.SHA256) != 1 {
		t.Fatalf("systemd-measure printed %s (%v)", out, err)
	}
	events := append(UKISections(sections), Markers(EnterInitrd, LeaveInitrd)...)
	got := hex.EncodeToString(Replay(events)[11])
	if got != res.SHA256[0].Hash {
		t.Errorf("PCR 11 = %s, systemd-measure says %s", got, res.SHA256[0].Hash)
	}
}

func TestLoadOptions(t *testing.T) {
	e, err := LoadOptions([]byte("ab"))
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte{'a', 0, 'b', 0, 0, 0})
	if e.PCR != 9 || !bytes.Equal(e.Digest, want[:]) {
		t.Errorf("LoadOptions() = %v, want PCR 9 %x", e, want)
	}
	if _, err := LoadOptions([]byte("a\n")); err == nil {
		t.Error("a newline in the command line was accepted")
	}
}

// TestObservedBoot replays the PCR 4, 9 and 11 events of a real boot of the
// image under OVMF 2022.11 + systemd-stub 252 + Linux 6.1 (digests taken
// from the firmware event log) and checks that the event list this package
// builds gives the PCR values the TPM reported.
func TestObservedBoot(t *testing.T) {
	h := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	uki := h("639655422bbce884a97180fb1a7c45ea2b5855c053429d8bbda68eef3a130ac0")
	kernel := h("5f21ff2c0d5d899842b28a8b19901ba72cf7a7ab93c02a77fadc6ff72be85b31")
	events := append(BootApplication(uki, "BOOTX64.EFI"), Kernel(kernel),
		Event{PCR: 9, Digest: h("0104802225013e5195f3880335b862a4b67c9f38d829ac263afa0c33ee0b71b6")},
		Event{PCR: 9, Digest: h("a6a10c74091dbaa3ac619f28e82a05593bfd8e16fb5a03897966b92e365e1bce")},
	)
	got := Replay(events)
	for pcr, want := range map[uint32]string{
		4: "73549181c38d6583daf80aa420e7f4fea8423f41ff42b01b1b04df18109d01ca",
		9: "11282ce1e17a7b53df906b8576cbd69813ca2d0d6c00e00c521c37de89a47462",
	} {
		if hex.EncodeToString(got[pcr]) != want {
			t.Errorf("PCR %d = %x, the TPM had %s", pcr, got[pcr], want)
		}
	}
	// The firmware's own events are what this package computes.
	if hex.EncodeToString(events[0].Digest) != "3d6772b4f84ed47595d72a2c4c5ffd15f5bb72c7507fe26f2aaee2c69d5633ba" ||
		hex.EncodeToString(events[1].Digest) != "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119" {
		t.Errorf("EV_EFI_ACTION or EV_SEPARATOR digest differs from OVMF's: %v", events[:2])
	}
}

// TestObservedPCR5 replays PCR 5 for the GPT of an image that was booted
// on the local cloud (OVMF 2022.11): testdata/observed-gpt.bin is that
// disk's first 34 sectors, and the TPM reported the value below
// (orrery-pcrs.service on the console).
func TestObservedPCR5(t *testing.T) {
	f, err := os.Open("testdata/observed-gpt.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := PCR5(f)
	if err != nil {
		t.Fatal(err)
	}
	got := Replay(events)[5]
	if want := "a5784b6880a06d315a4736b18b698cc518c26b51b77cffdc5b5349767aad153e"; hex.EncodeToString(got) != want {
		t.Fatalf("PCR 5 = %x, the TPM had %s", got, want)
	}
	data, _ := GPTEventData(f)
	// Header (92 bytes), a count of 3 partitions, 3 entries of 128 bytes.
	if len(data) != 92+8+3*128 || data[92] != 3 {
		t.Fatalf("UEFI_GPT_DATA is %d bytes with count %d", len(data), data[92])
	}
}

func TestGPTEventDataRejectsGarbage(t *testing.T) {
	raw, err := os.ReadFile("testdata/observed-gpt.bin")
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"no signature":     func(b []byte) []byte { b[512] = 'X'; return b },
		"huge entry count": func(b []byte) []byte { binary.LittleEndian.PutUint32(b[512+80:], 1<<31); return b },
		"tiny entry size":  func(b []byte) []byte { binary.LittleEndian.PutUint32(b[512+84:], 8); return b },
		"truncated":        func(b []byte) []byte { return b[:1024] },
		"empty":            func([]byte) []byte { return nil },
	} {
		if _, err := GPTEventData(bytes.NewReader(mutate(bytes.Clone(raw)))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzGPTEventData(f *testing.F) {
	raw, err := os.ReadFile("testdata/observed-gpt.bin")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add(raw[:600])
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = GPTEventData(bytes.NewReader(b))
	})
}
