package pendingjoin

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

func TestSaveLoadRemove(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := Load(dir); !errors.Is(err, fs.ErrNotExist) || Exists(dir) {
		t.Fatalf("Load() of nothing = %v, Exists %v; want fs.ErrNotExist, false", err, Exists(dir))
	}
	want := &joinpb.IssueJoinTicketResponse{ApiServerEndpoint: "10.0.2.5:6443", ClusterCaCert: []byte{1, 2}}
	if err := Save(dir, want, []byte("key")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(Path(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record: %v, %v; want mode 0600", fi, err)
	}
	got, key, err := Load(dir)
	if err != nil || got.GetApiServerEndpoint() != want.ApiServerEndpoint || !bytes.Equal(got.GetClusterCaCert(), want.ClusterCaCert) || string(key) != "key" {
		t.Fatalf("Load() = %v, %q, %v", got, key, err)
	}
	if err := Remove(dir); err != nil || Exists(dir) {
		t.Fatalf("Remove() = %v, Exists %v", err, Exists(dir))
	}
	if err := Remove(dir); err != nil {
		t.Errorf("Remove() of nothing = %v", err)
	}
}

// FuzzLoad: the record is on a disk root on the node can write; the
// initrd reads it before the OS starts.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"ticket":"CgEB","clientKey":"a2V5"}`))
	f.Add([]byte(`{"ticket":7}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(Path(dir), b, 0o600); err != nil {
			t.Fatal(err)
		}
		tk, key, err := Load(dir)
		if err == nil && (tk == nil || len(key) == 0) {
			t.Fatalf("Load() = %v, %q, nil: a record without a ticket or key", tk, key)
		}
		if err != nil && strings.Contains(err.Error(), "\x00") {
			t.Errorf("the error carries the record's bytes: %v", err)
		}
	})
}
