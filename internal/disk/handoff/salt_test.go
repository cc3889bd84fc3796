package handoff

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMeasurementSaltRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "var/lib/orrery/measurement-salt")
	salt := bytes.Repeat([]byte{5}, 32)
	if err := WriteMeasurementSalt(path, salt); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMeasurementSalt(path)
	if err != nil || !bytes.Equal(got, salt) {
		t.Fatalf("ReadMeasurementSalt = %x, %v", got, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v", fi.Mode(), err)
	}
	if err := WriteMeasurementSalt(path, salt[:31]); err == nil {
		t.Error("a 31-byte salt was written")
	}
	if err := os.WriteFile(path, salt[:7], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMeasurementSalt(path); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("a truncated salt: %v", err)
	}
}
