package handoff

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
)

func TestVolumeRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "volume.json")
	want := cryptsetup.Authenticated.Volume("0b7f9f1c-3a52-4c36-a8c4-6c2b0b9d7a11")
	if err := WriteVolumeRecord(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadVolumeRecord(path)
	if err != nil || got != want {
		t.Fatalf("read %+v, %v; want %+v", got, err, want)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o400 {
		t.Errorf("mode %v, want 0400", st.Mode().Perm())
	}
	// Written once: a second record would let a later step point
	// bootstrapperd at another volume.
	if err := WriteVolumeRecord(path, cryptsetup.Volume{UUID: "other"}); err == nil {
		t.Fatal("an existing record was overwritten")
	}
	if got, _ := ReadVolumeRecord(path); got != want {
		t.Fatalf("record changed to %+v", got)
	}
}

func TestDamagedVolumeRecord(t *testing.T) {
	for name, content := range map[string]string{
		"truncated": `{"uuid":"0b7f9f1c-3a52`,
		"no UUID":   `{"cipher":"aes-xts-plain64"}`,
		"garbage":   "\xff\x00",
		"empty":     "",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "volume.json")
			if err := os.WriteFile(path, []byte(content), 0o400); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadVolumeRecord(path); err == nil || !strings.Contains(err.Error(), "damaged") {
				t.Fatalf("err %v; want one that says the record is damaged", err)
			}
		})
	}
	if _, err := ReadVolumeRecord(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing record was read")
	}
}
