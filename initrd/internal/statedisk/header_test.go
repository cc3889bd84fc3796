package statedisk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup/headertest"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
)

// keyedDisk is a state disk as a node's later boot finds it, made with
// the real cryptsetup: formatted as Prepare formats it (integrity added
// to the header afterwards: formatting dm-integrity needs device-mapper)
// and labelled as keyed to a cluster.
func keyedDisk(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Skip("cryptsetup not installed (make deps)")
	}
	dir := t.TempDir()
	dev := filepath.Join(dir, "disk")
	if err := os.WriteFile(dev, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, bytes.Repeat([]byte{7}, 32), 0o400); err != nil {
		t.Fatal(err)
	}
	opts := cryptsetup.StateDisk.FormatOpts()
	opts.Format, opts.Label = cryptsetup.EncryptedOnly, handoff.KeyedLabel
	var tool cryptsetup.Tool
	if err := tool.FormatLUKS2(context.Background(), dev, key, opts); err != nil {
		t.Fatal(err)
	}
	headertest.Rewrite(t, dev, headertest.AddIntegrity)
	return dev
}

// TestPrepareChecksTheHeader runs Prepare with the real cryptsetup on a
// later boot's disk: as formatted, it is the cluster's (ErrInitialised);
// rewritten as in the review's nullsegment.py, it is refused, naming the
// field, and left as it is.
func TestPrepareChecksTheHeader(t *testing.T) {
	p := &Preparer{LUKS: &cryptsetup.Tool{}, Mkfs: &fakeMkfs{}, KeyFile: filepath.Join(t.TempDir(), "key"),
		Mount: func(string, string, string, uintptr, string) error { t.Fatal("mounted"); return nil }}
	dev := keyedDisk(t)
	if _, err := p.Prepare(context.Background(), dev); !errors.Is(err, ErrInitialised) {
		t.Fatalf("Prepare(a state disk) = %v, want ErrInitialised", err)
	}
	for _, label := range []string{handoff.KeyedLabel, handoff.FirstBootLabel} {
		t.Run(label, func(t *testing.T) {
			dev := keyedDisk(t)
			headertest.Rewrite(t, dev, headertest.NullSegment)
			if out, err := exec.Command("cryptsetup", "config", "--label", label, dev).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			before, err := os.ReadFile(dev)
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Prepare(context.Background(), dev)
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), `segments.0.encryption is "cipher_null-ecb", want "aes-xts-plain64"`) {
				t.Fatalf("Prepare(tampered) = %v", err)
			}
			t.Logf("refused: %v", err)
			if after, _ := os.ReadFile(dev); !bytes.Equal(after, before) {
				t.Error("the refused disk changed")
			}
			if _, err := os.Stat(p.KeyFile); err == nil {
				t.Error("a key was written for the refused disk")
			}
		})
	}
}
