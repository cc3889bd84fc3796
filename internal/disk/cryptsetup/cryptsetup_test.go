package cryptsetup

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// blankDiskAndKey skips without cryptsetup, else returns a directory with
// a blank 32 MiB disk file and a key file in it.
func blankDiskAndKey(t *testing.T) (dir, disk, key string) {
	t.Helper()
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Skip("cryptsetup not installed (Debian package cryptsetup-bin; make deps)")
	}
	dir = t.TempDir()
	disk = filepath.Join(dir, "disk")
	if err := os.WriteFile(disk, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	key = filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o400); err != nil {
		t.Fatal(err)
	}
	return dir, disk, key
}

// TestFormatOnFile formats a LUKS2 volume on a plain file, which works
// without device-mapper (opening it would not).
func TestFormatOnFile(t *testing.T) {
	ctx := context.Background()
	dir, disk, key := blankDiskAndKey(t)
	var tool Tool
	if ok, err := tool.IsLUKS(ctx, disk); err != nil || ok {
		t.Fatalf("IsLUKS(blank) = %v, %v; want false, nil", ok, err)
	}
	if err := tool.FormatLUKS2(ctx, disk, key, FormatOpts{Format: EncryptedOnly, PBKDF: "pbkdf2", Iterations: 1000, Label: "test"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := tool.IsLUKS(ctx, disk); err != nil || !ok {
		t.Fatalf("IsLUKS(formatted) = %v, %v; want true, nil", ok, err)
	}
	if _, err := tool.IsLUKS(ctx, filepath.Join(dir, "missing")); err == nil {
		t.Error("IsLUKS(missing file) succeeded")
	}
}

func TestInspectOnFile(t *testing.T) {
	ctx := context.Background()
	dir, disk, key := blankDiskAndKey(t)
	var tool Tool
	const uuid = "0b6e1a52-6f7c-4f0e-9d7e-3c1f2a4b5c6d"
	// Formatting with integrity needs device-mapper, which test hosts may
	// lack; the initrd's VM test formats Authenticated.
	if err := tool.FormatLUKS2(ctx, disk, key, FormatOpts{Format: EncryptedOnly, PBKDF: "pbkdf2", Iterations: 1000, UUID: uuid}); err != nil {
		t.Fatal(err)
	}
	got, err := tool.Inspect(ctx, disk)
	if err != nil {
		t.Fatal(err)
	}
	if want := EncryptedOnly.Volume(uuid); got != want || !EncryptedOnly.Matches(got) || Authenticated.Matches(got) {
		t.Errorf("Inspect = %+v, want %+v", got, want)
	}

	// A volume someone else formatted shows what it is.
	weak := filepath.Join(dir, "weak")
	if err := os.WriteFile(weak, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--cipher", "aes-cbc-essiv:sha256",
		"--key-size", "128", "--key-file", key, "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", weak).CombinedOutput()
	if err != nil {
		t.Fatalf("luksFormat: %v: %s", err, out)
	}
	got, err = tool.Inspect(ctx, weak)
	if err != nil {
		t.Fatal(err)
	}
	if got.Cipher != "aes-cbc-essiv:sha256" || got.KeyBits != 128 || got.UUID == uuid {
		t.Errorf("Inspect(weak) = %+v", got)
	}
	if _, err := tool.Inspect(ctx, filepath.Join(dir, "missing")); err == nil {
		t.Error("Inspect(missing file) succeeded")
	}
}

func TestParseMetadata(t *testing.T) {
	tests := map[string]struct {
		raw     string
		want    Volume
		wantErr bool
	}{
		"orrery": {
			raw:  `{"keyslots":{"0":{"key_size":64},"1":{"key_size":64}},"segments":{"0":{"type":"crypt","encryption":"aes-xts-plain64"}}}`,
			want: Volume{Cipher: "aes-xts-plain64", KeyBits: 512},
		},
		"integrity": {
			raw:  `{"keyslots":{"0":{"key_size":96}},"segments":{"0":{"type":"crypt","encryption":"aes-xts-plain64","integrity":{"type":"hmac(sha256)"}}}}`,
			want: Volume{Cipher: "aes-xts-plain64", KeyBits: 768, Integrity: "hmac(sha256)"},
		},
		"two segments":           {raw: `{"keyslots":{"0":{"key_size":64}},"segments":{"0":{"type":"crypt"},"1":{"type":"crypt"}}}`, wantErr: true},
		"linear segment":         {raw: `{"keyslots":{"0":{"key_size":64}},"segments":{"0":{"type":"linear"}}}`, wantErr: true},
		"no keyslot":             {raw: `{"keyslots":{},"segments":{"0":{"type":"crypt","encryption":"aes-xts-plain64"}}}`, wantErr: true},
		"keyslots disagree":      {raw: `{"keyslots":{"0":{"key_size":64},"1":{"key_size":32}},"segments":{"0":{"type":"crypt"}}}`, wantErr: true},
		"not JSON":               {raw: `LUKS`, wantErr: true},
		"segments not an object": {raw: `{"segments":[]}`, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseMetadata([]byte(tc.raw))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseMetadata(f *testing.F) {
	f.Add([]byte(`{"keyslots":{"0":{"key_size":64}},"segments":{"0":{"type":"crypt","encryption":"aes-xts-plain64"}}}`))
	f.Add([]byte(`{"keyslots":{"0":{"key_size":96}},"segments":{"0":{"type":"crypt","encryption":"x","integrity":{"type":"hmac(sha256)"}}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := parseMetadata(raw)
		if err == nil && v.KeyBits <= 0 {
			t.Fatalf("accepted a header without a volume key size: %q", raw)
		}
	})
}

func TestLabelOnFile(t *testing.T) {
	ctx := context.Background()
	_, disk, key := blankDiskAndKey(t)
	var tool Tool
	if err := tool.FormatLUKS2(ctx, disk, key, FormatOpts{Format: EncryptedOnly, PBKDF: "pbkdf2", Iterations: 1000, Label: "first"}); err != nil {
		t.Fatal(err)
	}
	if got, err := tool.Label(ctx, disk); err != nil || got != "first" {
		t.Fatalf("Label = %q, %v; want first", got, err)
	}
	if err := tool.SetLabel(ctx, disk, "second"); err != nil {
		t.Fatal(err)
	}
	if got, err := tool.Label(ctx, disk); err != nil || got != "second" {
		t.Fatalf("Label after SetLabel = %q, %v; want second", got, err)
	}
	if _, err := parseLabel([]byte("LUKS header information\nVersion: 2\n")); err == nil {
		t.Error("a dump without a label line parsed")
	}
	if got, err := parseLabel([]byte("Version: 2\nLabel:          (no label)\n")); err != nil || got != "" {
		t.Errorf("no label = %q, %v", got, err)
	}
}
