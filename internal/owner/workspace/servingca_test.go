package workspace

import (
	"bytes"
	"os"
	"testing"
	"time"
)

// The pair of a move is made once and read back the same until the move
// is done; a file that is no pair is an error, not replaced.
func TestKubeletServingCAIsKeptUntilRemoved(t *testing.T) {
	d := Dir(t.TempDir())
	now := time.Now()
	cert, key, err := d.KubeletServingCA(now)
	if err != nil {
		t.Fatal(err)
	}
	again, againKey, err := d.KubeletServingCA(now)
	if err != nil || !bytes.Equal(again, cert) || !bytes.Equal(againKey, key) {
		t.Fatalf("a second call gave another pair (%v)", err)
	}
	if fi, err := os.Stat(d.Path(KubeletServingCAFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the kept pair's mode: %v, %v", fi, err)
	}
	if err := d.RemoveKubeletServingCA(); err != nil {
		t.Fatal(err)
	}
	if next, _, err := d.KubeletServingCA(now); err != nil || bytes.Equal(next, cert) {
		t.Fatalf("after the removal: %v, want a new pair", err)
	}
	if err := os.WriteFile(d.Path(KubeletServingCAFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.KubeletServingCA(now); err == nil {
		t.Fatal("a kept file that is no pair was taken")
	}
	if b, _ := os.ReadFile(d.Path(KubeletServingCAFile)); string(b) != "{" {
		t.Fatal("a kept file that is no pair was replaced")
	}
}
