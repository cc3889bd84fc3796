package pcrlog_test

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-tpm-tools/client"

	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

// TestMeasureReplaysToTPM measures into a real TPM and checks that replaying
// the log reproduces every allocated bank's PCR values exactly.
func TestMeasureReplaysToTPM(t *testing.T) {
	rw := swtpmtest.Open(t, swtpmtest.Start(t))
	log := &pcrlog.Log{Path: filepath.Join(t.TempDir(), "run", "measurements.log")}

	steps := []struct {
		pcr  uint32
		data string
	}{{11, "enter-initrd"}, {11, "leave-initrd"}, {15, "cluster-id"}, {13, "x"}}
	for _, s := range steps {
		if err := log.Measure(rw, s.pcr, []byte(s.data), "test: "+s.data); err != nil {
			t.Fatalf("Measure(%d, %q): %v", s.pcr, s.data, err)
		}
	}
	entries, err := pcrlog.Read(log.Path)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(steps) {
		t.Fatalf("log has %d entries, want %d", len(entries), len(steps))
	}

	banks, err := client.ReadAllPCRs(rw)
	if err != nil {
		t.Fatal(err)
	}
	for _, bank := range banks {
		h, err := bankHash(uint32(bank.GetHash()))
		if err != nil {
			t.Fatal(err)
		}
		replayed, err := pcrlog.Replay(entries, h, nil)
		if err != nil {
			t.Fatalf("replay %v: %v", h, err)
		}
		for _, pcr := range []uint32{11, 13, 15} {
			if got, want := replayed[pcr], bank.GetPcrs()[pcr]; !bytes.Equal(got, want) {
				t.Errorf("bank %v PCR %d: replayed %x, TPM has %x", h, pcr, got, want)
			}
		}
	}

	// Independent computation for the SHA-256 bank of PCR 11.
	zero := make([]byte, 32)
	d1 := sha256.Sum256([]byte("enter-initrd"))
	d2 := sha256.Sum256([]byte("leave-initrd"))
	v1 := sha256.Sum256(append(zero, d1[:]...))
	v2 := sha256.Sum256(append(v1[:], d2[:]...))
	replayed, _ := pcrlog.Replay(entries, crypto.SHA256, nil)
	if !bytes.Equal(replayed[11], v2[:]) {
		t.Errorf("PCR 11 replay = %x, independent computation %x", replayed[11], v2)
	}
	if got := pcrlog.Describe(entries, 11); strings.Join(got, ",") != "test: enter-initrd,test: leave-initrd" {
		t.Errorf("Describe(11) = %v", got)
	}
}

func bankHash(alg uint32) (crypto.Hash, error) {
	switch alg {
	case 0x0004:
		return crypto.SHA1, nil
	case 0x000B:
		return crypto.SHA256, nil
	case 0x000C:
		return crypto.SHA384, nil
	case 0x000D:
		return crypto.SHA512, nil
	}
	return 0, os.ErrInvalid
}

func TestConcurrentRecordsKeepWholeLines(t *testing.T) {
	log := &pcrlog.Log{Path: filepath.Join(t.TempDir(), "m.log")}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := pcrlog.NewEntry(12, []byte{byte(i)}, strings.Repeat("d", 900), crypto.SHA256)
			if err := log.Record(e, func() error { return nil }); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	entries, err := pcrlog.Read(log.Path)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 50 {
		t.Fatalf("got %d entries, want 50", len(entries))
	}
}

func TestRecordSkipsFailedExtend(t *testing.T) {
	log := &pcrlog.Log{Path: filepath.Join(t.TempDir(), "m.log")}
	e := pcrlog.NewEntry(12, []byte("a"), "a", crypto.SHA256)
	if err := log.Record(e, func() error { return os.ErrPermission }); err == nil {
		t.Fatal("Record succeeded although the extend failed")
	}
	entries, err := pcrlog.Read(log.Path)
	if err != nil || len(entries) != 0 {
		t.Fatalf("log after failed extend: %v entries, err %v; want empty", len(entries), err)
	}
}

func TestParseRejects(t *testing.T) {
	good := `{"pcr":11,"digests":{"sha256":"` + strings.Repeat("ab", 32) + `"},"description":"x"}`
	tests := map[string]struct {
		raw     string
		wantErr string
	}{
		"valid":              {raw: good + "\n"},
		"empty":              {raw: ""},
		"truncated line":     {raw: good[:40] + "\n", wantErr: "line 1"},
		"missing newline":    {raw: good, wantErr: "truncated"},
		"pcr out of range":   {raw: strings.Replace(good, `"pcr":11`, `"pcr":24`, 1) + "\n", wantErr: "out of range"},
		"short digest":       {raw: strings.Replace(good, strings.Repeat("ab", 32), "abab", 1) + "\n", wantErr: "has 2 bytes"},
		"bad hex":            {raw: strings.Replace(good, strings.Repeat("ab", 32), strings.Repeat("zz", 32), 1) + "\n", wantErr: "not hex"},
		"unknown algorithm":  {raw: strings.Replace(good, "sha256", "md5", 1) + "\n", wantErr: "unknown digest algorithm"},
		"no digests":         {raw: `{"pcr":11,"digests":{},"description":"x"}` + "\n", wantErr: "no digests"},
		"unknown field":      {raw: strings.Replace(good, `"description"`, `"evil":1,"description"`, 1) + "\n", wantErr: "unknown field"},
		"trailing data":      {raw: good + " {}\n", wantErr: "trailing data"},
		"garbage":            {raw: "\x00\x01\x02\n", wantErr: "line 1"},
		"second line broken": {raw: good + "\n{\n", wantErr: "line 2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := pcrlog.Parse([]byte(tc.raw))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestReplayNeedsDigestOfBank(t *testing.T) {
	e := pcrlog.NewEntry(11, []byte("a"), "only sha1", crypto.SHA1)
	if _, err := pcrlog.Replay([]pcrlog.Entry{e}, crypto.SHA256, nil); err == nil {
		t.Fatal("replay of a SHA-256 bank accepted an entry without a SHA-256 digest")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"pcr":11,"digests":{"sha256":"` + strings.Repeat("ab", 32) + `"},"description":"x"}` + "\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, raw []byte) {
		entries, err := pcrlog.Parse(raw)
		if err != nil {
			return
		}
		// Whatever parses must replay without panicking in every bank.
		for _, h := range []crypto.Hash{crypto.SHA1, crypto.SHA256} {
			_, _ = pcrlog.Replay(entries, h, nil)
		}
	})
}

// The join service's pod has the node's log on a read-only mount; a
// snapshot must not need to write it. (As root, permissions do not stop
// an open for writing, so this only proves anything as another user.)
func TestSnapshotOfReadOnlyLog(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root may write a 0444 file anyway; run as another user to test this")
	}
	path := filepath.Join(t.TempDir(), "measurements.log")
	l := &pcrlog.Log{Path: path}
	if err := l.Record(pcrlog.NewEntry(11, []byte("enter-initrd"), "initrd: enter-initrd", crypto.SHA256), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
	raw, err := l.Snapshot(func() error { return nil })
	if err != nil {
		t.Fatalf("snapshot of a read-only log: %v", err)
	}
	if entries, err := pcrlog.Parse(raw); err != nil || len(entries) != 1 {
		t.Fatalf("snapshot = %d entries, %v; want the one recorded", len(entries), err)
	}
}
