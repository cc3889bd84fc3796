package statedisk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
)

// fakeLUKS records what Prepare asks of cryptsetup.
type fakeLUKS struct {
	isLUKS   bool
	label    string
	failOpen bool
	// badHeader is what CheckHeader says of the disk; badCopy, what
	// SaveHeader says of the header read back after formatting, whose
	// UUID is copyUUID if set (else the one formatted).
	badHeader, badCopy error
	copyUUID           string
	formatted          cryptsetup.FormatOpts
	keySeen            []byte
	calls              []string
}

func (f *fakeLUKS) IsLUKS(_ context.Context, dev string) (bool, error) {
	f.calls = append(f.calls, "isLuks "+dev)
	return f.isLUKS, nil
}

func (f *fakeLUKS) CheckHeader(_ context.Context, dev string, h cryptsetup.Header) (cryptsetup.Volume, error) {
	f.calls = append(f.calls, "checkHeader "+dev)
	if h != cryptsetup.StateDisk {
		return cryptsetup.Volume{}, errors.New("checked against another header")
	}
	return cryptsetup.Volume{}, f.badHeader
}

func (f *fakeLUKS) SaveHeader(_ context.Context, dev, path string, h cryptsetup.Header) (cryptsetup.Volume, error) {
	f.calls = append(f.calls, "saveHeader "+dev+" "+filepath.Base(path))
	if f.badCopy != nil {
		return cryptsetup.Volume{}, f.badCopy
	}
	uuid := f.copyUUID
	if uuid == "" {
		uuid = f.formatted.UUID
	}
	return h.Format.Volume(uuid), os.WriteFile(path, []byte("header"), 0o600)
}

func (f *fakeLUKS) Label(_ context.Context, dev string) (string, error) {
	f.calls = append(f.calls, "label "+dev)
	return f.label, nil
}

func (f *fakeLUKS) FormatLUKS2(_ context.Context, dev, keyFile string, o cryptsetup.FormatOpts) error {
	f.calls = append(f.calls, "luksFormat "+dev)
	f.formatted = o
	var err error
	f.keySeen, err = os.ReadFile(keyFile)
	return err
}

func (f *fakeLUKS) OpenChecked(_ context.Context, dev, header, name, keyFile string, h cryptsetup.Header) error {
	f.calls = append(f.calls, "open "+dev+" "+filepath.Base(header)+" "+name)
	if b, err := os.ReadFile(header); err != nil || string(b) != "header" || h != cryptsetup.StateDisk {
		return fmt.Errorf("opened without the checked header: %v", err)
	}
	if f.failOpen {
		return errors.New("no key available with this passphrase")
	}
	return nil
}

// nullSegment is what CheckHeader says of a header rewritten as in the
// review's nullsegment.py.
var nullSegment = &cryptsetup.FormatError{Where: "LUKS2 header of /dev/vdb", Field: "segments.0.encryption", Got: `"cipher_null-ecb"`, Want: `"aes-xts-plain64"`}

type fakeMkfs struct{ dev string }

func (f *fakeMkfs) MakeExt4(_ context.Context, dev, label string) error {
	f.dev = dev
	return nil
}

type mount struct{ source, target, fstype, data string }

func disk(t *testing.T, content []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestIsBlank(t *testing.T) {
	withHeader := make([]byte, 4<<20)
	copy(withHeader, "LUKS\xba\xbe")
	lateData := make([]byte, 4<<20)
	lateData[blankCheckSize-1] = 1
	beyond := make([]byte, 4<<20)
	beyond[blankCheckSize] = 1
	tests := map[string]struct {
		content []byte
		want    bool
	}{
		"zero":                     {make([]byte, 4<<20), true},
		"small zero":               {make([]byte, 4096), true},
		"empty":                    {nil, false},
		"header":                   {withHeader, false},
		"data in the first MiB":    {lateData, false},
		"data after the first MiB": {beyond, true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := IsBlank(disk(t, tt.content))
			if err != nil || got != tt.want {
				t.Fatalf("IsBlank() = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	if _, err := IsBlank(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("IsBlank(missing) succeeded")
	}
}

// prepareCase is a case of TestPrepare.
type prepareCase struct {
	content  []byte
	luks     fakeLUKS
	wantErr  string
	wantIs   error
	wantKey  bool
	wantMnts int
}

// prepareCases are TestPrepare's cases.
var prepareCases = map[string]prepareCase{
	"first boot":  {content: make([]byte, 2<<20), wantKey: true, wantMnts: 5},
	"initialised": {content: make([]byte, 2<<20), luks: fakeLUKS{isLUKS: true, label: handoff.KeyedLabel}, wantIs: ErrInitialised},
	// Unknown: maybe a cluster's; never reformatted.
	"initialised, other label": {content: make([]byte, 2<<20), luks: fakeLUKS{isLUKS: true, label: ""}, wantIs: ErrInitialised},
	// Formatted at an earlier first boot, never keyed: its key is
	// gone with that boot's /run.
	"abandoned first boot": {content: append([]byte("LUKS\xba\xbe"), make([]byte, 2<<20)...), luks: fakeLUKS{isLUKS: true, label: handoff.FirstBootLabel}, wantKey: true, wantMnts: 5},
	"holds data":           {content: append([]byte("XFSB"), make([]byte, 2<<20)...), wantErr: "neither blank nor a LUKS volume"},
	"open fails":           {content: make([]byte, 2<<20), luks: fakeLUKS{failOpen: true}, wantErr: "open state disk", wantKey: true},
	// A header a host rewrote: refused before any key, never formatted.
	"tampered header": {
		content: append([]byte("LUKS\xba\xbe"), make([]byte, 2<<20)...),
		luks:    fakeLUKS{isLUKS: true, label: handoff.KeyedLabel, badHeader: nullSegment},
		wantIs:  ErrRefused,
	},
	"tampered header, first-boot label": {
		content: append([]byte("LUKS\xba\xbe"), make([]byte, 2<<20)...),
		luks:    fakeLUKS{isLUKS: true, label: handoff.FirstBootLabel, badHeader: nullSegment},
		wantIs:  ErrRefused,
	},
	// The header read back after formatting is not the one written.
	"rewritten after formatting": {
		content: make([]byte, 2<<20), luks: fakeLUKS{badCopy: nullSegment},
		wantErr: `read back the state disk's new header: LUKS2 header of /dev/vdb: segments.0.encryption is "cipher_null-ecb"`, wantKey: true,
	},
	"swapped after formatting": {
		content: make([]byte, 2<<20), luks: fakeLUKS{copyUUID: "0b6e1a52-6f7c-4f0e-9d7e-3c1f2a4b5c6d"},
		wantErr: "something else rewrote the disk", wantKey: true,
	},
}

func TestPrepare(t *testing.T) {
	tests := prepareCases
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			sysroot := filepath.Join(dir, "sysroot")
			keyFile := filepath.Join(dir, "run", "orrery", "first-boot-key")
			var mounts []mount
			luks := tt.luks
			mkfs := &fakeMkfs{}
			p := &Preparer{
				LUKS: &luks,
				Mkfs: mkfs,
				Mount: func(source, target, fstype string, _ uintptr, data string) error {
					mounts = append(mounts, mount{source, target, fstype, data})
					return nil
				},
				Rand:         bytes.NewReader(bytes.Repeat([]byte{7}, 64)),
				KeyFile:      keyFile,
				VolumeRecord: filepath.Join(dir, "run", "orrery", "first-boot-volume.json"),
				Sysroot:      sysroot,
				RunDir:       filepath.Join(dir, "run"),
			}
			dev := disk(t, tt.content)
			_, err := p.Prepare(context.Background(), dev)
			checkPrepareErr(t, tt, err)
			key, kerr := os.ReadFile(keyFile)
			if !tt.wantKey {
				if kerr == nil {
					t.Fatal("key file written")
				}
				for _, c := range luks.calls {
					if !strings.HasPrefix(c, "isLuks ") && !strings.HasPrefix(c, "label ") && !strings.HasPrefix(c, "checkHeader ") {
						t.Fatalf("touched the disk: %v", luks.calls)
					}
				}
				if now, _ := os.ReadFile(dev); !bytes.Equal(now, tt.content) {
					t.Fatal("the disk's content changed")
				}
				return
			}
			if !bytes.Equal(key, bytes.Repeat([]byte{7}, 32)) || !bytes.Equal(luks.keySeen, key) {
				t.Fatalf("key file holds %x, cryptsetup saw %x", key, luks.keySeen)
			}
			if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o400 {
				t.Fatalf("key file mode: %v, %v", fi.Mode(), err)
			}
			if want := cryptsetup.StateDisk.FormatOpts(); luks.formatted.PBKDF != "pbkdf2" || luks.formatted.Iterations != 1000 ||
				luks.formatted.DataOffset != want.DataOffset || luks.formatted.SectorSize != 4096 || luks.formatted.Format != cryptsetup.Authenticated {
				t.Errorf("formatted with %+v", luks.formatted)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(keyFile), "state-header")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the header copy is left: %v", err)
			}
			for _, c := range luks.calls {
				if strings.HasPrefix(c, "open ") && (tt.luks.badCopy != nil || tt.luks.copyUUID != "") {
					t.Fatalf("opened a disk whose header was refused: %v", luks.calls)
				}
			}
			checkRecord(t, p.VolumeRecord, luks.formatted.UUID)
			if len(mounts) != tt.wantMnts {
				t.Fatalf("mounts = %+v, want %d", mounts, tt.wantMnts)
			}
			if tt.wantMnts == 0 {
				return
			}
			if mkfs.dev != "/dev/mapper/state" {
				t.Errorf("mkfs on %q", mkfs.dev)
			}
			if m := mounts[0]; m.source != "/dev/mapper/state" || m.target != filepath.Join(sysroot, "var") || m.fstype != "ext4" {
				t.Errorf("state mount = %+v", m)
			}
		})
	}
}

// checkPrepareErr checks Prepare's error err against what the case tt
// wants.
func checkPrepareErr(t *testing.T, tt prepareCase, err error) {
	t.Helper()
	switch {
	case tt.wantIs != nil:
		if !errors.Is(err, tt.wantIs) {
			t.Fatalf("Prepare() = %v, want %v", err, tt.wantIs)
		}
		if tt.wantIs == ErrRefused && (!strings.Contains(err.Error(), `segments.0.encryption is "cipher_null-ecb", want "aes-xts-plain64"`) || //nolint:errorlint // which sentinel the case wants, not an error
			!strings.Contains(err.Error(), "blank disk")) {
			t.Errorf("Prepare() = %v: does not say what it saw and what to do", err)
		}
	case tt.wantErr != "":
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Fatalf("Prepare() = %v, want an error containing %q", err, tt.wantErr)
		}
	case err != nil:
		t.Fatal(err)
	}
}

// checkRecord: the bootstrapper re-keys only the volume the record
// names, so it must name the UUID the volume was formatted with.
func checkRecord(t *testing.T, path, uuid string) {
	t.Helper()
	if len(uuid) != 36 || uuid[14] != '4' {
		t.Errorf("formatted with UUID %q, want a random (version 4) UUID", uuid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no record of the formatted volume: %v", err)
	}
	var got cryptsetup.Volume
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if want := cryptsetup.Authenticated.Volume(uuid); got != want {
		t.Errorf("record = %+v, want %+v", got, want)
	}
}

// TestKeyFileNotOverwritten: a second Prepare in the same boot must not
// replace the passphrase the first one formatted with.
func TestKeyFileNotOverwritten(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("old"), 0o400); err != nil {
		t.Fatal(err)
	}
	p := &Preparer{LUKS: &fakeLUKS{}, Mkfs: &fakeMkfs{}, KeyFile: keyFile,
		Mount: func(string, string, string, uintptr, string) error { return nil }}
	if _, err := p.Prepare(context.Background(), disk(t, make([]byte, 4096))); err == nil {
		t.Fatal("Prepare() overwrote an existing key file")
	}
}
