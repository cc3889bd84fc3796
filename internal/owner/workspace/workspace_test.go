package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMasterSecretIsMadeOnce(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "owner"))
	if err := d.Create(); err != nil {
		t.Fatal(err)
	}
	first, created, err := d.MasterSecret()
	if err != nil || !created {
		t.Fatalf("first: created %v, %v", created, err)
	}
	again, created, err := d.MasterSecret()
	if err != nil || created || !bytes.Equal(again.Key, first.Key) {
		t.Fatalf("second: created %v, same key %v, %v", created, bytes.Equal(again.Key, first.Key), err)
	}
	for _, p := range []string{string(d), d.Path(MasterSecretFile)} {
		st, err := os.Stat(p)
		if err != nil || st.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: %v, %v; want no access for others", p, st, err)
		}
	}
}

func TestStateKeepsItsSalt(t *testing.T) {
	d := Dir(t.TempDir())
	st, created, err := d.StateOrCreate("10.0.0.1:9000", "demo")
	if err != nil || !created || len(st.MeasurementSalt) == 0 {
		t.Fatalf("created %v, salt %d bytes, %v", created, len(st.MeasurementSalt), err)
	}
	st.ClusterID = []byte{1, 2, 3}
	if err := d.WriteState(st); err != nil {
		t.Fatal(err)
	}
	again, created, err := d.StateOrCreate("elsewhere", "other")
	if err != nil || created || !bytes.Equal(again.MeasurementSalt, st.MeasurementSalt) || again.Node != "10.0.0.1:9000" || !bytes.Equal(again.ClusterID, st.ClusterID) {
		t.Fatalf("state %+v created %v, %v; want the first one", again, created, err)
	}
	if _, err := os.Stat(d.Path(StateFile) + ".tmp"); err == nil {
		t.Error("a temporary file is left behind")
	}
}

// A damaged state file is never replaced by a new one: its salt is the
// only way to compute the cluster ID again.
func TestDamagedStateIsNotReplaced(t *testing.T) {
	for name, content := range map[string]string{
		"truncated": `{"node": "10.0.0.1:9000", "measurementSa`,
		"no salt":   `{"node": "10.0.0.1:9000"}`,
		"garbage":   "\x00\x01",
	} {
		t.Run(name, func(t *testing.T) {
			d := Dir(t.TempDir())
			if err := os.WriteFile(d.Path(StateFile), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := d.StateOrCreate("n", "c")
			if err == nil || !strings.Contains(err.Error(), "restore it from a backup") {
				t.Fatalf("err %v; want one that says to restore the file", err)
			}
			if got, _ := os.ReadFile(d.Path(StateFile)); string(got) != content {
				t.Fatal("the damaged file was overwritten")
			}
		})
	}
}
